// C ABI of native sampling (kvr_sampling_default_params, kvr_sampler_*): validates params and
// buffers, keeps each sampler's PRNG stream and candidate buffers. The math is sampling.cpp; the
// decode step that samples in place is kvr_seq_decode_sample (sequence.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "core/sampler.h"
#include "kvrelay.h"

using kvr::fail;
using kvr::format;

namespace kvr {

int32_t sampler_fail(kvr_sampler* s, int32_t status, const std::string& msg) {
  fail(status, msg);
  try {
    s->last_error = msg;
  } catch (...) {
    s->last_error.clear();
  }
  return status;
}

namespace {

// logits[0..width) with every token the mask disallows at -inf (ids >= mask_tokens included), in
// s->masked: the draw then runs on that row unchanged, so a disallowed token can never be drawn
// (it is not drawn and rejected) and the allowed ones keep their relative probabilities.
const float* masked_row(kvr_sampler* s, const float* logits, size_t width) {
  s->masked.resize(width);
  float* out = s->masked.data();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const size_t allowed_end = std::min<size_t>(width, s->mask_tokens);
  size_t i = 0;
  for (; i + 32 <= allowed_end; i += 32) {
    const uint32_t w = s->mask[i / 32];
    if (w == 0) {
      std::fill(out + i, out + i + 32, neg_inf);
    } else if (w == 0xffffffffu) {
      std::copy(logits + i, logits + i + 32, out + i);
    } else {
      for (size_t b = 0; b < 32; ++b) out[i + b] = (w >> b) & 1u ? logits[i + b] : neg_inf;
    }
  }
  for (; i < allowed_end; ++i) out[i] = (s->mask[i / 32] >> (i % 32)) & 1u ? logits[i] : neg_inf;
  std::fill(out + allowed_end, out + width, neg_inf);
  return out;
}

// logits[0..width) after the sampler's logit processing, in s->processed; `logits` itself when
// none applies to this draw.
const float* processed_row(kvr_sampler* s, const float* logits, size_t width) {
  const bool repeat = s->penalty.active() && !s->penalty.ids.empty();
  if (!repeat && !s->adjust.active()) return logits;
  s->processed.assign(logits, logits + width);
  float* row = s->processed.data();
  s->adjust.apply_before(row, width);
  if (repeat) s->penalty.apply(row, width);
  s->adjust.apply_after(row, width);
  return row;
}

}  // namespace

int32_t sampler_check_mask(kvr_sampler* s, size_t row_len) {
  if (s->mask_tokens > row_len)
    return sampler_fail(s, KVR_ERR_OUT_OF_RANGE,
                        format("the sampler's mask covers %u tokens, the vocabulary has %zu", s->mask_tokens,
                               row_len));
  return KVR_OK;
}

namespace {

// Draws from `logits`, the processed row (ban, bias, penalties applied), under the sampler's
// mask, records the token and fills the logprob outputs (those of `logits`, without the mask).
int32_t draw_processed(kvr_sampler* s, const float* logits, size_t width, int32_t* token_out,
                       double* logprob_out, int32_t* top_ids, double* top_logprobs, uint32_t top_len,
                       uint32_t* top_count_out) {
  const float* row = s->mask_tokens != 0 ? masked_row(s, logits, width) : logits;
  const int64_t id = s->cfg.temperature == 0 ? argmax_row(row, width)
                                             : sample_row(row, width, s->cfg, s->rng, s->scratch);
  // A masked row that fails names the mask only when the raw row had a finite logit: a row with
  // none is the model's failure (overflowed values), not the grammar's.
  if (id < 0)
    return sampler_fail(s, KVR_ERR_INVALID_ARGUMENT,
                        row != logits && argmax_row(logits, width) >= 0
                            ? format("sampling: no token the mask allows has a finite logit among %zu values", width)
                            : format("sampling: no finite logit among %zu values", width));
  *token_out = static_cast<int32_t>(id);
  s->kept_new_seen = s->penalty.active() && s->penalty.add(*token_out);
  s->adjust.add(*token_out);
  s->kept_token = *token_out;
  // Logprobs are those of the (penalised) row without the mask, as documented for
  // kvr_sampler_sample.
  const size_t n = logprobs_row(logits, width, id, logprob_out, top_len, top_ids, top_logprobs);
  if (top_count_out) *top_count_out = static_cast<uint32_t>(n);
  return KVR_OK;
}

}  // namespace

int32_t sampler_run(kvr_sampler* s, const float* logits, size_t width, int32_t* token_out,
                    double* logprob_out, int32_t* top_ids, double* top_logprobs, uint32_t top_len,
                    uint32_t* top_count_out) {
  // The processed row (ban, bias, repetition, presence/frequency) is what both the draw and the
  // logprobs see (as the reference LogitProcessor's row, tests/reference); the mask then applies
  // to the draw only.
  s->kept_width = 0;
  logits = processed_row(s, logits, width);
  if (s->keep_row) s->kept.assign(logits, logits + width);
  const int32_t st = draw_processed(s, logits, width, token_out, logprob_out, top_ids, top_logprobs, top_len,
                                    top_count_out);
  if (st == KVR_OK && s->keep_row) s->kept_width = width;
  return st;
}

int32_t sampler_run_candidates(kvr_sampler* s, sm::Route route, const float* vals, const int32_t* ids, size_t m,
                               size_t width, int32_t* token_out) {
  if (s->mask_tokens != 0)  // sampler_route sends masked samplers to the row path
    return sampler_fail(s, KVR_ERR_INTERNAL, "sampling: a masked sampler reached the device candidate path");
  const int64_t id = m == 0                       ? -1
                     : route == sm::Route::kGreedy ? ids[0]
                                                   : sample_candidates(vals, ids, m, s->cfg, s->rng, s->scratch);
  if (id < 0)
    return sampler_fail(s, KVR_ERR_INVALID_ARGUMENT,
                        format("sampling: no finite logit among %zu values", width));
  *token_out = static_cast<int32_t>(id);
  if (s->penalty.active()) s->penalty.add(*token_out);
  s->adjust.add(*token_out);
  s->kept_width = 0;  // sampler_route keeps samplers that keep rows off this path
  return KVR_OK;
}

int32_t sampler_check_out(kvr_sampler* s, const int32_t* token_out, const int32_t* top_ids,
                          const double* top_logprobs, uint32_t top_len) {
  if (!token_out) return sampler_fail(s, KVR_ERR_INVALID_ARGUMENT, "token_out is NULL");
  if (top_len > KVR_SAMPLER_MAX_TOP)
    return sampler_fail(s, KVR_ERR_INVALID_ARGUMENT,
                        format("top_len %u exceeds %d", top_len, KVR_SAMPLER_MAX_TOP));
  if (top_len > 0 && (!top_ids || !top_logprobs))
    return sampler_fail(s, KVR_ERR_INVALID_ARGUMENT,
                        format("top_ids or top_logprobs is NULL with top_len %u", top_len));
  return KVR_OK;
}

}  // namespace kvr

extern "C" {

KVR_API void kvr_sampling_default_params(kvr_sampling_params* p) {
  if (!p) return;
  *p = kvr_sampling_params{};
  p->temperature = 1.0;
  p->top_p = 1.0;
  p->min_p = 0.0;
  p->seed = 0;
  p->top_k = 0;
  p->reserved = 0;
}

KVR_API int32_t kvr_sampler_create(const kvr_sampling_params* p, kvr_sampler** out) {
  if (!out) return fail(KVR_ERR_INVALID_ARGUMENT, "out_sampler is NULL");
  *out = nullptr;
  if (!p) return fail(KVR_ERR_INVALID_ARGUMENT, "params is NULL");
  if (!std::isfinite(p->temperature) || p->temperature < 0)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("temperature must be a finite number >= 0, got %g", p->temperature));
  if (!(p->top_p > 0 && p->top_p <= 1))
    return fail(KVR_ERR_INVALID_ARGUMENT, format("top_p must be in (0, 1], got %g", p->top_p));
  if (!(p->min_p >= 0 && p->min_p <= 1))
    return fail(KVR_ERR_INVALID_ARGUMENT, format("min_p must be in [0, 1], got %g", p->min_p));
  const int64_t max_seed = (int64_t{1} << 53) - 1;
  if (p->seed > max_seed || p->seed < -max_seed)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("seed must be a safe integer (|seed| < 2^53), got %lld",
                       static_cast<long long>(p->seed)));
  if (p->reserved != 0)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("reserved must be 0, got %u", p->reserved));
  try {
    kvr_sampler* s = new kvr_sampler(p->seed);
    s->cfg.temperature = p->temperature;
    s->cfg.top_k = p->top_k;
    s->cfg.top_p = p->top_p;
    s->cfg.min_p = p->min_p;
    *out = s;
  } catch (...) {
    return fail(KVR_ERR_OUT_OF_MEMORY, "out of memory creating a sampler");
  }
  return KVR_OK;
}

KVR_API void kvr_sampler_free(kvr_sampler* s) { delete s; }

KVR_API const char* kvr_sampler_last_error(const kvr_sampler* s) {
  return s ? s->last_error.c_str() : "";
}

KVR_API int32_t kvr_sampler_set_repetition_penalty(kvr_sampler* s, double penalty,
                                                   const int32_t* seen_ids, size_t n_seen) {
  if (!s) return fail(KVR_ERR_INVALID_ARGUMENT, "sampler is NULL");
  if (!std::isfinite(penalty) || !(penalty > 0))
    return kvr::sampler_fail(
        s, KVR_ERR_INVALID_ARGUMENT,
        format("repetition_penalty must be a finite number > 0, got %g", penalty));
  if (n_seen > 0 && !seen_ids)
    return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT,
                             format("seen_ids is NULL with n_seen %zu", n_seen));
  for (size_t i = 0; i < n_seen; ++i)
    if (seen_ids[i] < 0)
      return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT,
                               format("seen_ids[%zu] = %d is negative", i, seen_ids[i]));
  try {
    kvr::RepetitionPenalty next;
    next.penalty = penalty;
    if (next.active())
      for (size_t i = 0; i < n_seen; ++i) next.add(seen_ids[i]);
    s->penalty = std::move(next);
  } catch (const std::bad_alloc&) {
    return kvr::sampler_fail(s, KVR_ERR_OUT_OF_MEMORY, "out of memory in sampling");
  }
  return KVR_OK;
}

KVR_API int32_t kvr_sampler_set_logit_bias(kvr_sampler* s, const int32_t* ids, const double* bias, size_t n) {
  if (!s) return fail(KVR_ERR_INVALID_ARGUMENT, "sampler is NULL");
  if (n > 0 && (!ids || !bias))
    return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT, format("ids or bias is NULL with n %zu", n));
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0)
      return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT, format("logit_bias ids[%zu] = %d is negative", i, ids[i]));
    if (!std::isfinite(bias[i]))
      return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT,
                               format("logit_bias[%d] must be a finite number, got %g", ids[i], bias[i]));
  }
  try {
    std::vector<int32_t> next_ids(ids, ids + n);
    std::vector<double> next_bias(bias, bias + n);
    s->adjust.bias_ids = std::move(next_ids);
    s->adjust.bias = std::move(next_bias);
  } catch (const std::bad_alloc&) {
    return kvr::sampler_fail(s, KVR_ERR_OUT_OF_MEMORY, "out of memory storing the logit bias");
  }
  return KVR_OK;
}

KVR_API int32_t kvr_sampler_set_presence_frequency(kvr_sampler* s, double presence, double frequency) {
  if (!s) return fail(KVR_ERR_INVALID_ARGUMENT, "sampler is NULL");
  if (!std::isfinite(presence))
    return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT,
                             format("presence_penalty must be a finite number, got %g", presence));
  if (!std::isfinite(frequency))
    return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT,
                             format("frequency_penalty must be a finite number, got %g", frequency));
  s->adjust.presence = presence;
  s->adjust.frequency = frequency;
  return KVR_OK;
}

KVR_API int32_t kvr_sampler_set_min_tokens(kvr_sampler* s, uint32_t min_tokens, const int32_t* stop_ids,
                                           size_t n_stop) {
  if (!s) return fail(KVR_ERR_INVALID_ARGUMENT, "sampler is NULL");
  if (n_stop > 0 && !stop_ids)
    return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT, format("stop_ids is NULL with n_stop %zu", n_stop));
  for (size_t i = 0; i < n_stop; ++i)
    if (stop_ids[i] < 0)
      return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT, format("stop_ids[%zu] = %d is negative", i, stop_ids[i]));
  try {
    std::vector<int32_t> next(stop_ids, stop_ids + n_stop);
    s->adjust.ban_ids = std::move(next);
  } catch (const std::bad_alloc&) {
    return kvr::sampler_fail(s, KVR_ERR_OUT_OF_MEMORY, "out of memory storing the stop ids");
  }
  s->adjust.min_tokens = min_tokens;
  return KVR_OK;
}

KVR_API int32_t kvr_sampler_sample(kvr_sampler* s, const float* logits, size_t logits_len,
                                   uint32_t width, int32_t* token_out, double* logprob_out,
                                   int32_t* top_ids, double* top_logprobs, uint32_t top_len,
                                   uint32_t* top_count_out) {
  if (!s) return fail(KVR_ERR_INVALID_ARGUMENT, "sampler is NULL");
  if (!logits) return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT, "logits is NULL");
  if (width == 0 || width > logits_len)
    return kvr::sampler_fail(
        s, KVR_ERR_INVALID_ARGUMENT,
        format("width must be in [1, logits_len %zu], got %u", logits_len, width));
  if (int32_t st = kvr::sampler_check_out(s, token_out, top_ids, top_logprobs, top_len)) return st;
  if (int32_t st = kvr::sampler_check_mask(s, logits_len)) return st;
  try {
    return kvr::sampler_run(s, logits, width, token_out, logprob_out, top_ids, top_logprobs, top_len,
                            top_count_out);
  } catch (const std::bad_alloc&) {
    return kvr::sampler_fail(s, KVR_ERR_OUT_OF_MEMORY, "out of memory in sampling");
  } catch (...) {
    return kvr::sampler_fail(s, KVR_ERR_INTERNAL, "internal error in sampling");
  }
}

KVR_API int32_t kvr_sampler_set_mask(kvr_sampler* s, const uint32_t* words, size_t words_len, uint32_t n_tokens) {
  if (!s) return fail(KVR_ERR_INVALID_ARGUMENT, "sampler is NULL");
  if (n_tokens == 0) {
    if (words != nullptr || words_len != 0)
      return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT, "n_tokens 0 (clear the mask) takes words NULL, words_len 0");
    s->mask_tokens = 0;
    return KVR_OK;
  }
  if (!words) return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT, "words is NULL");
  const size_t need = (static_cast<size_t>(n_tokens) + 31) / 32;
  if (words_len != need)
    return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT,
                             format("a mask of %u tokens takes %zu words, got words_len %zu", n_tokens, need, words_len));
  const uint32_t tail = n_tokens % 32;
  if (tail != 0 && (words[need - 1] >> tail) != 0)
    return kvr::sampler_fail(s, KVR_ERR_OUT_OF_RANGE,
                             format("the mask allows a token id >= n_tokens %u (bits past it must be 0)", n_tokens));
  bool any = false;
  for (size_t i = 0; i < need && !any; ++i) any = words[i] != 0;
  if (!any) return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT, "the mask allows no token");
  try {
    s->mask.assign(words, words + need);
  } catch (...) {
    s->mask_tokens = 0;
    return kvr::sampler_fail(s, KVR_ERR_OUT_OF_MEMORY, "out of memory storing the mask");
  }
  s->mask_tokens = n_tokens;
  return KVR_OK;
}

KVR_API int32_t kvr_sampler_keep_row(kvr_sampler* s, uint32_t keep) {
  if (!s) return fail(KVR_ERR_INVALID_ARGUMENT, "sampler is NULL");
  if (keep > 1) return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT, format("keep must be 0 or 1, got %u", keep));
  s->keep_row = keep != 0;
  s->kept_width = 0;  // the buffer stays: a grammar's draws switch keeping on and off often
  return KVR_OK;
}

KVR_API int32_t kvr_sampler_redraw(kvr_sampler* s, int32_t* token_out, double* logprob_out, int32_t* top_ids,
                                   double* top_logprobs, uint32_t top_len, uint32_t* top_count_out) {
  if (!s) return fail(KVR_ERR_INVALID_ARGUMENT, "sampler is NULL");
  if (int32_t st = kvr::sampler_check_out(s, token_out, top_ids, top_logprobs, top_len)) return st;
  if (s->kept_width == 0)
    return kvr::sampler_fail(s, KVR_ERR_INVALID_ARGUMENT,
                             "no draw to redraw (keep_row off when it was drawn, it failed, or it was redrawn)");
  const size_t width = s->kept_width;
  s->kept_width = 0;  // once per draw
  // The state before the draw being replaced: its token no longer counts.
  if (s->kept_new_seen) s->penalty.forget_last(s->kept_token);
  s->adjust.undo_add(s->kept_token);
  try {
    return kvr::draw_processed(s, s->kept.data(), width, token_out, logprob_out, top_ids, top_logprobs, top_len,
                               top_count_out);
  } catch (const std::bad_alloc&) {
    return kvr::sampler_fail(s, KVR_ERR_OUT_OF_MEMORY, "out of memory in sampling");
  } catch (...) {
    return kvr::sampler_fail(s, KVR_ERR_INTERNAL, "internal error in sampling");
  }
}

}  // extern "C"
