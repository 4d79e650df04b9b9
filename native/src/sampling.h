// Token sampling from one logits row, the native twin of lib/engine/sampler.ts: greedy argmax, or
// temperature → top_k → top_p → min_p and a draw from the seeded xoshiro128** stream of
// lib/engine/prng.ts — the same float64 arithmetic in the same order (and the fdlibm exp that
// V8's Math.exp uses), so identical logits and seed give identical tokens. Plus log-softmax
// logprobs of the chosen and top-n tokens. Not the C ABI (sampler_api.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvr {

// xoshiro128** seeded through splitmix32 exactly as Xoshiro128 in lib/engine/prng.ts.
class Xoshiro128 {
 public:
  explicit Xoshiro128(int64_t seed);
  uint32_t next_u32();
  double next_double();  // 53 random bits in [0, 1)

 private:
  uint32_t s_[4];
};

// fdlibm's __ieee754_exp as ported in V8 (src/base/ieee754.cc), i.e. JavaScript's Math.exp.
double js_exp(double x);
// JavaScript's Math.log (correctly rounded), for logprobs equal to lib/engine's bit for bit.
double js_log(double x);

struct SamplingConfig {
  double temperature = 1.0;  // 0 = greedy
  uint32_t top_k = 0;        // 0 = off
  double top_p = 1.0;        // (0, 1], 1 = off
  double min_p = 0.0;        // [0, 1], 0 = off
};

// Reusable candidate buffers (one per sampler; not shared between threads).
struct SamplingScratch {
  std::vector<int32_t> ids;
  std::vector<double> probs;
};

// Index of the largest of logits[0..n), NaN as -inf, ties to the lowest index; -1 when none is
// above -inf.
int64_t argmax_row(const float* logits, size_t n);

// One token from logits[0..n) with cfg (temperature > 0) and rng; -1 when no logit is finite.
int64_t sample_row(const float* logits, size_t n, const SamplingConfig& cfg, Xoshiro128& rng,
                   SamplingScratch& scratch);

// Log-softmax (temperature 1, no filters, float64) of token `id` over logits[0..n), and the
// `top` most likely ids (logit descending, ties lower id first; fewer when fewer are finite)
// with theirs. Returns how many top entries were written. Requires a finite logit in the row.
size_t logprobs_row(const float* logits, size_t n, int64_t id, double* id_logprob, size_t top,
                    int32_t* top_ids, double* top_logprobs);

}  // namespace kvr
