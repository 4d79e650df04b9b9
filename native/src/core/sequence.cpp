// kvr_seq: a token sequence of one model; its KV cache and scratch are the backend's SeqState.
// Implements create/free, prefill/decode (validate everything, then Backend::forward), truncate,
// KV read/write (validated here, copied by the backend) and set_length. Every failure, including
// a backend's BackendError, is recorded on the sequence and in the thread-local last error.
// Not the forward math (cpu/batch_forward.cpp) nor any cache layout (the backends).
#include <new>
#include <string>

#include "core/backend.h"
#include "core/errors.h"
#include "core/model.h"
#include "core/sampler.h"
#include "core/sequence.h"  // struct kvr_seq
#include "host/dtype.h"

namespace kvr {

int32_t seq_fail(kvr_seq* seq, int32_t status, const std::string& msg) {
  fail(status, msg);
  try {
    seq->last_error = msg;
  } catch (...) {
    seq->last_error.clear();
  }
  return status;
}

namespace {

int32_t check_tokens(kvr_seq* seq, const int32_t* tokens, size_t n) {
  const size_t vocab = seq->model->vocab;
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || static_cast<size_t>(tokens[i]) >= vocab)
      return seq_fail(seq, KVR_ERR_OUT_OF_RANGE,
                      format("token id %d at index %zu is out of range [0, %zu)", tokens[i], i, vocab));
  }
  return KVR_OK;
}

int32_t prefill_impl(kvr_seq* seq, const int32_t* tokens, size_t n, uint32_t all_positions, float* logits,
                     size_t logits_len) {
  const Model& m = *seq->model;
  if (!tokens) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, "tokens is NULL");
  if (n == 0) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, "n_tokens must be >= 1, got 0");
  if (all_positions > 1)
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("all_positions must be 0 or 1, got %u", all_positions));
  if (!logits) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, "logits_out is NULL");
  const size_t cap = seq->capacity;
  if (n > cap - seq->length)
    return seq_fail(seq, KVR_ERR_CAPACITY,
                    format("prefill of %zu tokens at length %u exceeds capacity %zu", n, seq->length, cap));
  const size_t need = all_positions ? n * m.vocab : m.vocab;  // n <= capacity (u32): no overflow
  if (logits_len < need)
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT,
                    format("logits_len %zu is too small: need %zu (%s x vocab %zu)", logits_len, need,
                           all_positions ? "n_tokens" : "1", m.vocab));
  if (int32_t st = check_tokens(seq, tokens, n)) return st;
  m.backend->reserve(*seq->state, seq->length, seq->length + n);  // paged: blocks all or none (POOL_EXHAUSTED)
  m.backend->forward(*seq->state, tokens, n, seq->length, all_positions != 0, logits);
  seq->length += static_cast<uint32_t>(n);
  return KVR_OK;
}

// The sampling decode step: the token is checked and appended (Backend::forward_sample); the
// sampling status comes back with the token appended (kvrelay.h kvr_seq_decode_sample).
int32_t decode_sample_impl(kvr_seq* seq, int32_t token, const SampleRequest& r) {
  const Model& m = *seq->model;
  if (seq->capacity - seq->length < 1)
    return seq_fail(seq, KVR_ERR_CAPACITY,
                    format("prefill of 1 tokens at length %u exceeds capacity %u", seq->length, seq->capacity));
  if (int32_t st = check_tokens(seq, &token, 1)) return st;
  if (seq->logits.size() < m.vocab) seq->logits.resize(m.vocab);
  m.backend->reserve(*seq->state, seq->length, seq->length + 1);
  const int32_t st = m.backend->forward_sample(*seq->state, token, seq->length, r, seq->logits.data());
  seq->length += 1;
  return st == KVR_OK ? KVR_OK : seq_fail(seq, st, r.sampler->last_error);
}

// Shared checks of kv_read / kv_write. bytes_each: required k_bytes (= v_bytes).
int32_t kv_check(kvr_seq* seq, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype, const void* k,
                 size_t k_bytes, const void* v, size_t v_bytes, bool write) {
  const Model& kv = *seq->model;
  if (layer >= kv.layers)
    return seq_fail(seq, KVR_ERR_OUT_OF_RANGE, format("layer %u out of range [0, %zu)", layer, kv.layers));
  if (!dtype_valid(dtype))
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("dtype %u is not a kvr_dtype (0 f32, 1 f16, 2 bf16)", dtype));
  const uint64_t end = static_cast<uint64_t>(start) + count;
  if (!write && end > seq->length)
    return seq_fail(seq, KVR_ERR_OUT_OF_RANGE,
                    format("kv_read range [%u, %llu) exceeds length %u", start, (unsigned long long)end, seq->length));
  if (write && (start > seq->length || end > seq->capacity))
    return seq_fail(seq, KVR_ERR_OUT_OF_RANGE,
                    format("kv_write range [%u, %llu) invalid: start must be <= length %u and end <= capacity %u",
                           start, (unsigned long long)end, seq->length, seq->capacity));
  const size_t need = kv.kv_heads * static_cast<size_t>(count) * kv.head_dim * dtype_size(dtype);
  if (k_bytes != need || v_bytes != need)
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT,
                    format("k_bytes %zu / v_bytes %zu must equal kv_heads %zu x count %u x head_dim %zu x %zu (%s) = %zu",
                           k_bytes, v_bytes, kv.kv_heads, count, kv.head_dim, dtype_size(dtype), dtype_name(dtype),
                           need));
  if (need > 0 && (!k || !v)) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, "k or v buffer is NULL");
  return KVR_OK;
}

}  // namespace
}  // namespace kvr

using kvr::fail;
using kvr::format;
using kvr::seq_fail;

extern "C" {

KVR_API int32_t kvr_seq_create(kvr_model* model, uint32_t capacity, kvr_seq** out_seq) {
  if (!out_seq) return fail(KVR_ERR_INVALID_ARGUMENT, "out_seq is NULL");
  *out_seq = nullptr;
  if (!model) return fail(KVR_ERR_INVALID_ARGUMENT, "model is NULL");
  if (capacity == 0) return fail(KVR_ERR_INVALID_ARGUMENT, "capacity must be >= 1, got 0");
  const kvr::Model& m = *model->m;
  const size_t es = kvr::dtype_size(m.params.kv_dtype);
  const double total = 2.0 * m.layers * m.kv_heads * m.head_dim * es * static_cast<double>(capacity);
  if (total > 9.0e18) return fail(KVR_ERR_OUT_OF_MEMORY, format("KV cache of %u tokens is too large", capacity));
  kvr_seq* seq = nullptr;
  try {
    seq = new kvr_seq;
    seq->model = model->m;
    seq->capacity = capacity;
    seq->state = m.backend->create_seq(capacity);
  } catch (const kvr::BackendError& e) {
    delete seq;
    return fail(e.status, e.message);
  } catch (const std::bad_alloc&) {
    delete seq;
    return fail(KVR_ERR_OUT_OF_MEMORY, "out of memory creating a sequence");
  } catch (...) {
    delete seq;
    return fail(KVR_ERR_INTERNAL, "internal error creating a sequence");
  }
  *out_seq = seq;
  return KVR_OK;
}

KVR_API void kvr_seq_free(kvr_seq* seq) { delete seq; }

KVR_API uint32_t kvr_seq_length(const kvr_seq* seq) { return seq ? seq->length : 0; }

KVR_API uint32_t kvr_seq_capacity(const kvr_seq* seq) { return seq ? seq->capacity : 0; }

KVR_API const char* kvr_seq_last_error(const kvr_seq* seq) { return seq ? seq->last_error.c_str() : ""; }

KVR_API int32_t kvr_seq_prefill(kvr_seq* seq, const int32_t* tokens, size_t n_tokens, uint32_t all_positions,
                                float* logits_out, size_t logits_len) {
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  return kvr::seq_guarded(seq, "prefill",
                      [&] { return kvr::prefill_impl(seq, tokens, n_tokens, all_positions, logits_out, logits_len); });
}

KVR_API int32_t kvr_seq_decode(kvr_seq* seq, int32_t token, float* logits_out, size_t logits_len) {
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  return kvr::seq_guarded(seq, "decode", [&] { return kvr::prefill_impl(seq, &token, 1, 0, logits_out, logits_len); });
}

KVR_API int32_t kvr_seq_decode_sample(kvr_seq* seq, int32_t token, kvr_sampler* sampler, uint32_t width,
                                      int32_t* token_out, double* logprob_out, int32_t* top_ids,
                                      double* top_logprobs, uint32_t top_len, uint32_t* top_count_out) {
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  return kvr::seq_guarded(seq, "decode_sample", [&]() -> int32_t {
    const size_t vocab = seq->model->vocab;
    if (!sampler) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, "sampler is NULL");
    if (width == 0 || width > vocab)
      return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("width must be in [1, vocab %zu], got %u", vocab, width));
    if (int32_t st = kvr::sampler_check_out(sampler, token_out, top_ids, top_logprobs, top_len))
      return seq_fail(seq, st, sampler->last_error);
    if (int32_t st = kvr::sampler_check_mask(sampler, vocab)) return seq_fail(seq, st, sampler->last_error);
    kvr::SampleRequest r;
    r.sampler = sampler;
    r.width = width;
    r.token_out = token_out;
    r.logprob_out = logprob_out;
    r.top_ids = top_ids;
    r.top_logprobs = top_logprobs;
    r.top_len = top_len;
    r.top_count_out = top_count_out;
    return kvr::decode_sample_impl(seq, token, r);
  });
}

KVR_API int32_t kvr_seq_truncate(kvr_seq* seq, uint32_t n_tokens) {
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  if (n_tokens > seq->length)
    return seq_fail(seq, KVR_ERR_OUT_OF_RANGE,
                    format("truncate to %u tokens exceeds length %u", n_tokens, seq->length));
  seq->length = n_tokens;
  seq->model->backend->shrink(*seq->state, n_tokens);  // paged: blocks past the length go back
  return KVR_OK;
}

KVR_API int32_t kvr_seq_kv_read(const kvr_seq* cseq, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype,
                                void* k_out, size_t k_bytes, void* v_out, size_t v_bytes) {
  if (!cseq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  kvr_seq* seq = const_cast<kvr_seq*>(cseq);  // only last_error is written
  return kvr::seq_guarded(seq, "kv_read", [&] {
    if (int32_t st = kvr::kv_check(seq, layer, start, count, dtype, k_out, k_bytes, v_out, v_bytes, false)) return st;
    if (count > 0) seq->model->backend->kv_read(*seq->state, layer, start, count, dtype, k_out, v_out);
    return static_cast<int32_t>(KVR_OK);
  });
}

KVR_API int32_t kvr_seq_kv_write(kvr_seq* seq, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype,
                                 const void* k_in, size_t k_bytes, const void* v_in, size_t v_bytes) {
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  return kvr::seq_guarded(seq, "kv_write", [&] {
    if (int32_t st = kvr::kv_check(seq, layer, start, count, dtype, k_in, k_bytes, v_in, v_bytes, true)) return st;
    if (count == 0) return static_cast<int32_t>(KVR_OK);
    seq->model->backend->reserve(*seq->state, start, static_cast<size_t>(start) + count);
    seq->model->backend->kv_write(*seq->state, layer, start, count, dtype, k_in, v_in);
    return static_cast<int32_t>(KVR_OK);
  });
}

KVR_API int32_t kvr_seq_set_length(kvr_seq* seq, uint32_t n_tokens) {
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  if (n_tokens > seq->capacity)
    return seq_fail(seq, KVR_ERR_OUT_OF_RANGE,
                    format("set_length %u exceeds capacity %u", n_tokens, seq->capacity));
  return kvr::seq_guarded(seq, "set_length", [&] {
    seq->model->backend->reserve(*seq->state, n_tokens, n_tokens);  // paged: blocks for [0, n), nothing written
    seq->length = n_tokens;
    seq->model->backend->shrink(*seq->state, n_tokens);
    return static_cast<int32_t>(KVR_OK);
  });
}

}  // extern "C"
