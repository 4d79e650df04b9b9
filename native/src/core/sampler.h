// The kvr_sampler handle's layout, internal to the library: sampling settings, the PRNG stream
// and reusable buffers of one generation. Shared by sampler_api.cpp (kvr_sampler_*) and
// sequence.cpp (kvr_seq_decode_sample). Not public ABI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "host/sampling.h"
#include "kvrelay.h"

struct kvr_sampler {
  explicit kvr_sampler(int64_t seed) : rng(seed) {}
  kvr::SamplingConfig cfg;
  kvr::Xoshiro128 rng;
  kvr::SamplingScratch scratch;
  kvr::RepetitionPenalty penalty;
  kvr::LogitAdjust adjust;    // min_tokens ban, logit_bias, presence/frequency penalties
  std::vector<float> processed;  // the row after adjust and penalty (sampler_run)
  std::string last_error;
  // The allowed-token mask (kvr_sampler_set_mask): bit t of mask[t / 32] set = token t may be
  // drawn; ids >= mask_tokens never. mask_tokens == 0: no mask.
  std::vector<uint32_t> mask;
  uint32_t mask_tokens = 0;
  std::vector<float> masked;  // the row with disallowed tokens at -inf (sampler_run)
  // Draw first, mask only when the grammar rejects (kvr_sampler_keep_row / kvr_sampler_redraw):
  // the last draw's row after ban, bias and penalties, and what that draw recorded, so one redraw
  // can replace it. kept_width == 0: nothing to redraw.
  bool keep_row = false;
  std::vector<float> kept;
  size_t kept_width = 0;
  int32_t kept_token = -1;
  bool kept_new_seen = false;  // the draw added its token to the repetition penalty's ids
};

namespace kvr {

// Records msg on the sampler and as this thread's last error; returns status.
int32_t sampler_fail(kvr_sampler* s, int32_t status, const std::string& msg);
// Checks that the sampler's mask fits a row of `row_len` logits (the vocabulary): a mask longer
// than the row names tokens that do not exist.
int32_t sampler_check_mask(kvr_sampler* s, size_t row_len);
// Checks the output buffers of a sample call (token_out, top arrays, top_len bound).
int32_t sampler_check_out(kvr_sampler* s, const int32_t* token_out, const int32_t* top_ids,
                          const double* top_logprobs, uint32_t top_len);
// Picks a token from logits[0..width) (validated) and fills the optional logprob outputs.
int32_t sampler_run(kvr_sampler* s, const float* logits, size_t width, int32_t* token_out,
                    double* logprob_out, int32_t* top_ids, double* top_logprobs, uint32_t top_len,
                    uint32_t* top_count_out);

// sampler_fail that never throws (the message is dropped when even that allocation fails).
inline void sample_step_failed(kvr_sampler* s, int32_t status, const char* msg) noexcept {
  try {
    sampler_fail(s, status, msg);
  } catch (...) {
    s->last_error.clear();
  }
}

// A batched step's draw (kvr_batch_step_sample): sampler_run's token without logprobs, or -1 in
// *token_out when the row has no finite logit (the message is then on the sampler). Never
// throws: it runs on the worker pool's threads (batch.cpp, cpu/batch_forward.cpp), whose bodies
// must not, so running out of memory fails the row (as kvr_sampler_sample does), not the step.
inline void sample_step_token(kvr_sampler* s, const float* logits, size_t width, int32_t* token_out) noexcept {
  try {
    if (sampler_run(s, logits, width, token_out, nullptr, nullptr, nullptr, 0, nullptr) == KVR_OK) return;
  } catch (const std::bad_alloc&) {
    sample_step_failed(s, KVR_ERR_OUT_OF_MEMORY, "out of memory in sampling");
  } catch (...) {
    sample_step_failed(s, KVR_ERR_INTERNAL, "internal error in sampling");
  }
  *token_out = -1;
}

// The step's token from a device's reduced row (common/sample_math.h plan_route): kGreedy takes
// ids[0]; kTopK draws from the m candidates (sample_candidates). m == 0: no finite logit among
// the `width` values (same message as sampler_run).
int32_t sampler_run_candidates(kvr_sampler* s, sm::Route route, const float* vals, const int32_t* ids, size_t m,
                               size_t width, int32_t* token_out);

// Where a device runs this sampler's draw (sm::plan_route). A masked sampler always takes the
// row (kRow): a device's top-k candidates may all be disallowed, and the draw must be the one
// over the masked row, so the CPU sampler applies the mask to the copied row. A repetition
// penalty, a ban, a bias or presence/frequency penalties change the row before any selection, so
// they need the whole row too.
inline sm::RoutePlan sampler_route(const kvr_sampler& s, uint32_t width, bool want_logprobs) {
  // A sampler that keeps its rows for a redraw needs the whole row too.
  if (s.mask_tokens != 0 || s.keep_row) return sm::RoutePlan{};
  return sm::plan_route(s.cfg.temperature, s.cfg.top_k, width,
                        want_logprobs || s.penalty.active() || s.adjust.active());
}

}  // namespace kvr
