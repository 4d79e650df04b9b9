// Token sampling from one logits row, the native twin of tests/reference/sampler.ts: greedy argmax, or
// temperature → top_k → top_p → min_p and a draw from the seeded xoshiro128** stream of
// lib/engine/prng.ts — the same float64 arithmetic in the same order (and the fdlibm exp that
// V8's Math.exp uses), so identical logits and seed give identical tokens. Plus log-softmax
// logprobs of the chosen and top-n tokens. Not the C ABI (sampler_api.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/sample_math.h"

namespace kvr {

// xoshiro128** seeded through splitmix32 exactly as Xoshiro128 in lib/engine/prng.ts (the
// arithmetic is common/sample_math.h, shared with the device).
class Xoshiro128 {
 public:
  explicit Xoshiro128(int64_t seed) : x_(sm::xoshiro_seed(seed)) {}
  uint32_t next_u32() { return sm::xoshiro_next(x_); }
  double next_double() { return sm::xoshiro_double(x_); }  // 53 random bits in [0, 1)
  const sm::Xoshiro& state() const { return x_; }

 private:
  sm::Xoshiro x_;
};

// fdlibm's __ieee754_exp as ported in V8 (src/base/ieee754.cc), i.e. JavaScript's Math.exp.
double js_exp(double x);
// js_exp of x[0..n) into out[0..n): the same bits, several lanes at a time where the CPU has
// AVX-512 (the sampler's exp pass over a whole vocabulary).
void js_exp_many(const double* x, double* out, size_t n);
// Which path js_exp_many takes in this process: "avx512", "avx2" or "scalar".
const char* js_exp_many_path();
// JavaScript's Math.log (correctly rounded), for logprobs equal to lib/engine's bit for bit.
double js_log(double x);

struct SamplingConfig {
  double temperature = 1.0;  // 0 = greedy
  uint32_t top_k = 0;        // 0 = off
  double top_p = 1.0;        // (0, 1], 1 = off
  double min_p = 0.0;        // [0, 1], 0 = off
};

// The repetition penalty of transformers and vLLM: every token seen so far (the prompt, then each
// drawn token) has its logit divided by `penalty` when positive and multiplied by it otherwise
// (penalty > 1 discourages repeats, < 1 encourages them, 1 = off), in float64 rounded back to
// float32 — the same bits as tests/reference/logits.ts applyRepetitionPenalty. One per sampler.
struct RepetitionPenalty {
  double penalty = 1.0;
  std::vector<int32_t> ids;   // distinct tokens seen, first-seen order
  std::vector<uint8_t> seen;  // seen[id] != 0 for the ids above (grown on demand)
  bool active() const { return penalty != 1.0; }
  // Records a token as seen (negative ids are ignored); whether it was not seen before.
  bool add(int32_t id);
  // Undoes the last add(id) that returned true.
  void forget_last(int32_t id);
  // The penalty on row[0..n), in place.
  void apply(float* row, size_t n) const;
};

// The rest of vLLM's per-request logit processing, applied around the repetition penalty in
// vLLM's order: tokens banned until min_tokens (the stop ids at -inf while fewer than min_tokens
// tokens were drawn), logit_bias (added), [repetition penalty], then OpenAI's presence and
// frequency penalties over the drawn tokens (logit -= count·frequency + presence). Each step in
// float64 rounded to float32, as lib/engine's reference LogitProcessor (tests/reference). One per
// sampler; counts every token the sampler draws.
struct LogitAdjust {
  uint32_t min_tokens = 0;
  std::vector<int32_t> ban_ids;             // the stop ids banned until min_tokens
  std::vector<int32_t> bias_ids;            // logit_bias: ids and what is added to their logits
  std::vector<double> bias;
  double presence = 0.0, frequency = 0.0;   // 0 = off
  uint32_t drawn = 0;                       // tokens drawn so far
  std::vector<int32_t> drawn_ids;           // distinct tokens drawn, first-drawn order
  std::vector<uint32_t> counts;             // counts[id]: how often id was drawn (grown on demand)
  bool banning() const { return drawn < min_tokens && !ban_ids.empty(); }
  bool penalising() const { return presence != 0.0 || frequency != 0.0; }
  // Whether the next draw's row differs from the model's (a device must then copy the row).
  bool active() const { return banning() || !bias_ids.empty() || penalising(); }
  // Records a drawn token (negative ids count toward min_tokens only).
  void add(int32_t id);
  // Undoes the last add(id) (no add since).
  void undo_add(int32_t id);
  // The ban and bias on row[0..n), in place (before the repetition penalty).
  void apply_before(float* row, size_t n) const;
  // The presence and frequency penalties on row[0..n), in place (after it).
  void apply_after(float* row, size_t n) const;
};

// Reusable candidate buffers (one per sampler; not shared between threads).
struct SamplingScratch {
  std::vector<int32_t> ids;
  std::vector<double> probs;
  std::vector<double> terms;  // exp((l[i] − max)/T) of each finite logit, computed once per draw
  std::vector<uint32_t> keys, keys_tmp;  // the top_p draw's radix sort: candidates' order keys
  std::vector<int32_t> ids_tmp;          // and its other buffer of ids
  std::vector<float> limit;  // the limit row of a row holding +inf (sampling.cpp limit_row)
};

// Index of the largest of logits[0..n), NaN as -inf, ties to the lowest index; -1 when none is
// above -inf.
int64_t argmax_row(const float* logits, size_t n);

// One token from logits[0..n) with cfg (temperature > 0) and rng; -1 when no logit is finite.
int64_t sample_row(const float* logits, size_t n, const SamplingConfig& cfg, Xoshiro128& rng,
                   SamplingScratch& scratch);

// The same draw as sample_row on a row whose candidates were reduced to vals/ids[0..m): the best
// m = min(top_k, finite logits) of the row in candidate order (sm::before), as the device's
// top-k selection returns them. Requires cfg.top_k >= 1 and temperature > 0: then sample_row's
// result depends only on those entries (its kept set is a prefix of them and the max is the
// first), so the token and the PRNG stream equal sample_row's on the full row. -1 when m == 0.
int64_t sample_candidates(const float* vals, const int32_t* ids, size_t m, const SamplingConfig& cfg,
                          Xoshiro128& rng, SamplingScratch& scratch);

// The host reference of the device selection: the best min(k, selectable) logits of
// logits[0..n) in candidate order into vals/ids (NaN and -inf never selected); returns how many.
size_t select_candidates(const float* logits, size_t n, size_t k, float* vals, int32_t* ids);

// Log-softmax (temperature 1, no filters, float64) of token `id` over logits[0..n), and the
// `top` most likely ids (logit descending, ties lower id first; fewer when fewer are finite)
// with theirs. Returns how many top entries were written. Requires a finite logit in the row.
size_t logprobs_row(const float* logits, size_t n, int64_t id, double* id_logprob, size_t top,
                    int32_t* top_ids, double* top_logprobs);

}  // namespace kvr
