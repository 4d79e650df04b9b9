// kvr_seq: a token sequence of one model with its own KV cache and scratch. Implements create/
// free, prefill/decode (validate everything, then run cpu::forward), truncate, KV read/write and
// set_length. Every failure is recorded on the sequence and in the thread-local last error.
// Not the forward math (cpu/forward.cpp) nor the cache layout (kv_cache.h).
#include <cstring>
#include <new>
#include <string>

#include "cpu/convert.h"
#include "cpu/forward.h"
#include "dtype.h"
#include "errors.h"
#include "kv_cache.h"
#include "model.h"
#include "sequence.h"  // struct kvr_seq

namespace kvr {
namespace {

int32_t seq_fail(kvr_seq* seq, int32_t status, const std::string& msg) {
  fail(status, msg);
  try {
    seq->last_error = msg;
  } catch (...) {
    seq->last_error.clear();
  }
  return status;
}

// Runs f, converting exceptions to statuses recorded on seq.
template <class F>
int32_t guarded(kvr_seq* seq, const char* what, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return seq_fail(seq, KVR_ERR_OUT_OF_MEMORY, format("out of memory in %s", what));
  } catch (const std::exception& e) {
    return seq_fail(seq, KVR_ERR_INTERNAL, format("internal error in %s: %s", what, e.what()));
  } catch (...) {
    return seq_fail(seq, KVR_ERR_INTERNAL, format("internal error in %s", what));
  }
}

// The failure of a paged sequence that cannot get the blocks for `tokens` positions.
int32_t pool_exhausted(kvr_seq* seq, size_t tokens) {
  const KvCache& kv = seq->kv;
  return seq_fail(seq, KVR_ERR_POOL_EXHAUSTED,
                  format("KV pool exhausted: %zu more block(s) of %zu tokens needed for %zu positions, %zu free",
                         kv.blocks_needed(tokens), kv.pool->block_tokens, tokens, kv.pool->free_count()));
}

int32_t prefill_impl(kvr_seq* seq, const int32_t* tokens, size_t n, uint32_t all_positions, float* logits,
                     size_t logits_len) {
  const Model& m = *seq->model;
  if (!tokens) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, "tokens is NULL");
  if (n == 0) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, "n_tokens must be >= 1, got 0");
  if (all_positions > 1)
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("all_positions must be 0 or 1, got %u", all_positions));
  if (!logits) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, "logits_out is NULL");
  const size_t cap = seq->kv.capacity;
  if (n > cap - seq->length)
    return seq_fail(seq, KVR_ERR_CAPACITY,
                    format("prefill of %zu tokens at length %u exceeds capacity %zu", n, seq->length, cap));
  const size_t need = all_positions ? n * m.vocab : m.vocab;  // n <= capacity (u32): no overflow
  if (logits_len < need)
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT,
                    format("logits_len %zu is too small: need %zu (%s x vocab %zu)", logits_len, need,
                           all_positions ? "n_tokens" : "1", m.vocab));
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || static_cast<size_t>(tokens[i]) >= m.vocab)
      return seq_fail(seq, KVR_ERR_OUT_OF_RANGE,
                      format("token id %d at index %zu is out of range [0, %zu)", tokens[i], i, m.vocab));
  }
  if (!seq->kv.reserve(seq->length + n)) return pool_exhausted(seq, seq->length + n);
  cpu::forward(m, seq->kv, tokens, n, seq->length, all_positions != 0, logits, seq->scratch);
  seq->length += static_cast<uint32_t>(n);
  return KVR_OK;
}

// Shared checks of kv_read / kv_write. bytes_each: required k_bytes (= v_bytes).
int32_t kv_check(kvr_seq* seq, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype, const void* k,
                 size_t k_bytes, const void* v, size_t v_bytes, bool write) {
  const KvCache& kv = seq->kv;
  if (layer >= kv.layers)
    return seq_fail(seq, KVR_ERR_OUT_OF_RANGE, format("layer %u out of range [0, %zu)", layer, kv.layers));
  if (!dtype_valid(dtype))
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("dtype %u is not a kvr_dtype (0 f32, 1 f16, 2 bf16)", dtype));
  const uint64_t end = static_cast<uint64_t>(start) + count;
  if (!write && end > seq->length)
    return seq_fail(seq, KVR_ERR_OUT_OF_RANGE,
                    format("kv_read range [%u, %llu) exceeds length %u", start, (unsigned long long)end, seq->length));
  if (write && (start > seq->length || end > kv.capacity))
    return seq_fail(seq, KVR_ERR_OUT_OF_RANGE,
                    format("kv_write range [%u, %llu) invalid: start must be <= length %u and end <= capacity %zu",
                           start, (unsigned long long)end, seq->length, kv.capacity));
  const size_t need = kv.kv_heads * static_cast<size_t>(count) * kv.head_dim * dtype_size(dtype);
  if (k_bytes != need || v_bytes != need)
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT,
                    format("k_bytes %zu / v_bytes %zu must equal kv_heads %zu x count %u x head_dim %zu x %zu (%s) = %zu",
                           k_bytes, v_bytes, kv.kv_heads, count, kv.head_dim, dtype_size(dtype), dtype_name(dtype),
                           need));
  if (need > 0 && (!k || !v)) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, "k or v buffer is NULL");
  return KVR_OK;
}

// Copies (kv_heads, count, head_dim) between a caller buffer in `dtype` and the cache's K
// (which = 0) or V (1) of one layer, run by run (a paged cache is contiguous within a block).
void kv_copy(const KvCache& kv, size_t layer, size_t which, uint32_t start, uint32_t count, uint32_t dtype,
             uint8_t* buf, bool to_cache) {
  const size_t hd = kv.head_dim, bes = dtype_size(dtype);
  std::vector<float> tmp;
  if (dtype != kv.dtype) tmp.resize(std::min<size_t>(count, kv.run(start)) * hd);
  for (size_t g = 0; g < kv.kv_heads; ++g) {
    for (size_t p = start; p < static_cast<size_t>(start) + count;) {
      const size_t len = std::min(kv.run(p), static_cast<size_t>(start) + count - p);
      const size_t elems = len * hd;
      uint8_t* c = kv.at(layer, which, g, p);
      uint8_t* b = buf + (g * count + (p - start)) * hd * bes;
      if (dtype == kv.dtype) {
        if (to_cache) std::memcpy(c, b, elems * bes);
        else std::memcpy(b, c, elems * bes);
      } else {
        if (tmp.size() < elems) tmp.resize(elems);
        if (to_cache) {
          cpu::to_f32(b, dtype, tmp.data(), elems);
          cpu::from_f32(tmp.data(), kv.dtype, c, elems);
        } else {
          cpu::to_f32(c, kv.dtype, tmp.data(), elems);
          cpu::from_f32(tmp.data(), dtype, b, elems);
        }
      }
      p += len;
    }
  }
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
  const size_t bytes = 2 * m.layers * m.kv_heads * m.head_dim * es * static_cast<size_t>(capacity);
  kvr_seq* seq = nullptr;
  try {
    seq = new kvr_seq;
    seq->model = model->m;
  } catch (...) {
    delete seq;
    return fail(KVR_ERR_OUT_OF_MEMORY, "out of memory creating a sequence");
  }
  kvr::KvCache& kv = seq->kv;
  kv.dtype = m.params.kv_dtype;
  kv.elem = es;
  kv.layers = m.layers;
  kv.kv_heads = m.kv_heads;
  kv.head_dim = m.head_dim;
  kv.capacity = capacity;
  kv.data = static_cast<uint8_t*>(std::calloc(bytes, 1));
  if (!kv.data) {
    delete seq;
    return fail(KVR_ERR_OUT_OF_MEMORY,
                format("out of memory allocating a KV cache of %zu bytes (capacity %u, %s)", bytes, capacity,
                       kvr::dtype_name(m.params.kv_dtype)));
  }
  *out_seq = seq;
  return KVR_OK;
}

KVR_API void kvr_seq_free(kvr_seq* seq) { delete seq; }

KVR_API uint32_t kvr_seq_length(const kvr_seq* seq) { return seq ? seq->length : 0; }

KVR_API uint32_t kvr_seq_capacity(const kvr_seq* seq) { return seq ? static_cast<uint32_t>(seq->kv.capacity) : 0; }

KVR_API const char* kvr_seq_last_error(const kvr_seq* seq) { return seq ? seq->last_error.c_str() : ""; }

KVR_API int32_t kvr_seq_prefill(kvr_seq* seq, const int32_t* tokens, size_t n_tokens, uint32_t all_positions,
                                float* logits_out, size_t logits_len) {
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  return kvr::guarded(seq, "prefill",
                      [&] { return kvr::prefill_impl(seq, tokens, n_tokens, all_positions, logits_out, logits_len); });
}

KVR_API int32_t kvr_seq_decode(kvr_seq* seq, int32_t token, float* logits_out, size_t logits_len) {
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  return kvr::guarded(seq, "decode", [&] { return kvr::prefill_impl(seq, &token, 1, 0, logits_out, logits_len); });
}

KVR_API int32_t kvr_seq_truncate(kvr_seq* seq, uint32_t n_tokens) {
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  if (n_tokens > seq->length)
    return seq_fail(seq, KVR_ERR_OUT_OF_RANGE,
                    format("truncate to %u tokens exceeds length %u", n_tokens, seq->length));
  seq->length = n_tokens;
  seq->kv.shrink(n_tokens);
  return KVR_OK;
}

KVR_API int32_t kvr_seq_kv_read(const kvr_seq* cseq, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype,
                                void* k_out, size_t k_bytes, void* v_out, size_t v_bytes) {
  if (!cseq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  kvr_seq* seq = const_cast<kvr_seq*>(cseq);  // only last_error is written
  return kvr::guarded(seq, "kv_read", [&] {
    if (int32_t st = kvr::kv_check(seq, layer, start, count, dtype, k_out, k_bytes, v_out, v_bytes, false)) return st;
    kvr::kv_copy(seq->kv, layer, 0, start, count, dtype, static_cast<uint8_t*>(k_out), false);
    kvr::kv_copy(seq->kv, layer, 1, start, count, dtype, static_cast<uint8_t*>(v_out), false);
    return static_cast<int32_t>(KVR_OK);
  });
}

KVR_API int32_t kvr_seq_kv_write(kvr_seq* seq, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype,
                                 const void* k_in, size_t k_bytes, const void* v_in, size_t v_bytes) {
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  return kvr::guarded(seq, "kv_write", [&] {
    if (int32_t st = kvr::kv_check(seq, layer, start, count, dtype, k_in, k_bytes, v_in, v_bytes, true)) return st;
    if (!seq->kv.reserve(static_cast<size_t>(start) + count)) return kvr::pool_exhausted(seq, start + count);
    kvr::kv_copy(seq->kv, layer, 0, start, count, dtype, const_cast<uint8_t*>(static_cast<const uint8_t*>(k_in)),
                 true);
    kvr::kv_copy(seq->kv, layer, 1, start, count, dtype, const_cast<uint8_t*>(static_cast<const uint8_t*>(v_in)),
                 true);
    return static_cast<int32_t>(KVR_OK);
  });
}

KVR_API int32_t kvr_seq_set_length(kvr_seq* seq, uint32_t n_tokens) {
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "seq is NULL");
  if (n_tokens > seq->kv.capacity)
    return seq_fail(seq, KVR_ERR_OUT_OF_RANGE,
                    format("set_length %u exceeds capacity %zu", n_tokens, seq->kv.capacity));
  const int32_t st = kvr::guarded(seq, "set_length", [&] {
    return seq->kv.reserve(n_tokens) ? static_cast<int32_t>(KVR_OK) : kvr::pool_exhausted(seq, n_tokens);
  });
  if (st != KVR_OK) return st;
  seq->length = n_tokens;
  seq->kv.shrink(n_tokens);
  return KVR_OK;
}

}  // extern "C"
