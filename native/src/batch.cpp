// The paged KV pool handle (kvr_kv_pool_*), paged sequences (kvr_seq_create_paged,
// kvr_seq_blocks) and the batched step (kvr_batch_step): argument checks, block reservation all
// or none, then cpu::forward_batch. Not the pool's free list (kv_pool.h), the block table
// (kv_cache.h) nor the forward math (cpu/batch_forward.cpp).
#include <algorithm>
#include <memory>
#include <new>
#include <string>
#include <unordered_set>
#include <vector>

#include "cpu/batch_forward.h"
#include "dtype.h"
#include "errors.h"
#include "kv_cache.h"
#include "kv_pool.h"
#include "model.h"
#include "sequence.h"

struct kvr_kv_pool {
  std::shared_ptr<const kvr::Model> model;
  std::shared_ptr<kvr::KvPool> pool;
};

namespace kvr {
namespace {

constexpr uint32_t kMaxBatchSeqs = 4096;
constexpr size_t kMaxBatchRows = 65536;

// Records msg on every sequence of the batch (those not NULL) and as the thread's last error.
int32_t batch_fail(kvr_seq* const* seqs, uint32_t n, int32_t status, const std::string& msg) {
  fail(status, msg);
  if (seqs)
    for (uint32_t i = 0; i < n; ++i) {
      if (!seqs[i]) continue;
      try {
        seqs[i]->last_error = msg;
      } catch (...) {
        seqs[i]->last_error.clear();
      }
    }
  return status;
}

int32_t batch_impl(kvr_seq* const* seqs, uint32_t n_seqs, const uint32_t* n_tokens, const int32_t* tokens,
                   size_t tokens_len, const uint32_t* want_logits, float* logits_out, size_t logits_len) {
  auto bad = [&](int32_t st, const std::string& msg) { return batch_fail(seqs, n_seqs, st, msg); };
  if (!seqs) return fail(KVR_ERR_INVALID_ARGUMENT, "seqs is NULL");
  if (n_seqs == 0 || n_seqs > kMaxBatchSeqs)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("n_seqs must be in [1, %u], got %u", kMaxBatchSeqs, n_seqs));
  for (uint32_t i = 0; i < n_seqs; ++i)
    if (!seqs[i]) return bad(KVR_ERR_INVALID_ARGUMENT, format("seqs[%u] is NULL", i));
  if (!n_tokens || !tokens || !want_logits)
    return bad(KVR_ERR_INVALID_ARGUMENT, "n_tokens, tokens or want_logits is NULL");
  const Model* model = seqs[0]->model.get();
  std::unordered_set<const kvr_seq*> seen;
  size_t rows = 0, want = 0;
  for (uint32_t i = 0; i < n_seqs; ++i) {
    const kvr_seq* s = seqs[i];
    if (s->model.get() != model)
      return bad(KVR_ERR_INVALID_ARGUMENT, format("seqs[%u] belongs to another model than seqs[0]", i));
    if (!seen.insert(s).second) return bad(KVR_ERR_INVALID_ARGUMENT, format("seqs[%u] appears twice", i));
    if (n_tokens[i] == 0) return bad(KVR_ERR_INVALID_ARGUMENT, format("n_tokens[%u] must be >= 1, got 0", i));
    if (want_logits[i] > 1)
      return bad(KVR_ERR_INVALID_ARGUMENT, format("want_logits[%u] must be 0 or 1, got %u", i, want_logits[i]));
    if (n_tokens[i] > s->kv.capacity - s->length)
      return bad(KVR_ERR_CAPACITY, format("seqs[%u]: %u tokens at length %u exceed capacity %zu", i, n_tokens[i],
                                          s->length, s->kv.capacity));
    rows += n_tokens[i];
    want += want_logits[i];
    if (rows > kMaxBatchRows)
      return bad(KVR_ERR_INVALID_ARGUMENT, format("the step has more than %zu tokens", kMaxBatchRows));
  }
  if (tokens_len != rows)
    return bad(KVR_ERR_INVALID_ARGUMENT, format("tokens_len %zu must equal the sum of n_tokens %zu", tokens_len, rows));
  for (size_t r = 0; r < rows; ++r)
    if (tokens[r] < 0 || static_cast<size_t>(tokens[r]) >= model->vocab)
      return bad(KVR_ERR_OUT_OF_RANGE,
                 format("token id %d at index %zu is out of range [0, %zu)", tokens[r], r, model->vocab));
  if (want > 0 && !logits_out) return bad(KVR_ERR_INVALID_ARGUMENT, "logits_out is NULL");
  if (logits_len < want * model->vocab)
    return bad(KVR_ERR_INVALID_ARGUMENT, format("logits_len %zu is too small: need %zu (%zu rows x vocab %zu)",
                                                logits_len, want * model->vocab, want, model->vocab));

  // Blocks, all or none: on a shortfall give back what this call took.
  std::vector<size_t> held(n_seqs);
  for (uint32_t i = 0; i < n_seqs; ++i) {
    KvCache& kv = seqs[i]->kv;
    held[i] = kv.table.size();
    if (kv.reserve(seqs[i]->length + static_cast<size_t>(n_tokens[i]))) continue;
    const size_t missing = kv.blocks_needed(seqs[i]->length + static_cast<size_t>(n_tokens[i]));
    const size_t free_now = kv.pool->free_count();
    for (uint32_t j = 0; j <= i; ++j) {
      KvCache& kj = seqs[j]->kv;
      if (kj.paged() && kj.table.size() > held[j]) {
        kj.pool->release(kj.table.data() + held[j], kj.table.size() - held[j]);
        kj.table.resize(held[j]);
      }
    }
    return bad(KVR_ERR_POOL_EXHAUSTED,
               format("KV pool exhausted: seqs[%u] needs %zu more block(s), %zu free after the earlier sequences",
                      i, missing, free_now));
  }

  std::vector<cpu::BatchSeq> batch(n_seqs);
  size_t off = 0, lrow = 0;
  for (uint32_t i = 0; i < n_seqs; ++i) {
    batch[i].kv = &seqs[i]->kv;
    batch[i].tokens = tokens + off;
    batch[i].n = n_tokens[i];
    batch[i].pos0 = seqs[i]->length;
    batch[i].logits = want_logits[i] ? logits_out + (lrow++) * model->vocab : nullptr;
    off += n_tokens[i];
  }
  static thread_local cpu::BatchScratch scratch;  // one per worker thread, reused across steps
  cpu::forward_batch(*model, batch.data(), n_seqs, scratch);
  for (uint32_t i = 0; i < n_seqs; ++i) seqs[i]->length += n_tokens[i];
  return KVR_OK;
}

}  // namespace
}  // namespace kvr

using kvr::fail;
using kvr::format;

extern "C" {

KVR_API int32_t kvr_kv_pool_create(kvr_model* model, uint32_t n_blocks, uint32_t block_tokens,
                                   kvr_kv_pool** out_pool) {
  if (!out_pool) return fail(KVR_ERR_INVALID_ARGUMENT, "out_pool is NULL");
  *out_pool = nullptr;
  if (!model) return fail(KVR_ERR_INVALID_ARGUMENT, "model is NULL");
  if (n_blocks == 0) return fail(KVR_ERR_INVALID_ARGUMENT, "n_blocks must be >= 1, got 0");
  if (block_tokens < 8 || block_tokens > 1024 || (block_tokens & (block_tokens - 1)) != 0)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("block_tokens must be a power of two in [8, 1024], got %u", block_tokens));
  const kvr::Model& m = *model->m;
  const size_t es = kvr::dtype_size(m.params.kv_dtype);
  const double bytes = 2.0 * m.layers * m.kv_heads * m.head_dim * es * block_tokens * static_cast<double>(n_blocks);
  if (bytes > 1.0e15)
    return fail(KVR_ERR_OUT_OF_MEMORY, format("a KV pool of %u blocks (%.0f bytes) is too large", n_blocks, bytes));
  try {
    auto pool = std::make_shared<kvr::KvPool>();
    pool->dtype = m.params.kv_dtype;
    pool->elem = es;
    pool->layers = m.layers;
    pool->kv_heads = m.kv_heads;
    pool->head_dim = m.head_dim;
    pool->block_tokens = block_tokens;
    pool->n_blocks = n_blocks;
    pool->block_bytes = 2 * m.layers * m.kv_heads * m.head_dim * es * block_tokens;
    pool->data = static_cast<uint8_t*>(std::calloc(pool->block_bytes * n_blocks, 1));
    if (!pool->data)
      return fail(KVR_ERR_OUT_OF_MEMORY,
                  format("out of memory allocating a KV pool of %u blocks x %zu bytes", n_blocks, pool->block_bytes));
    pool->init_free_list();
    *out_pool = new kvr_kv_pool{model->m, std::move(pool)};
  } catch (const std::bad_alloc&) {
    return fail(KVR_ERR_OUT_OF_MEMORY, "out of memory creating a KV pool");
  }
  return KVR_OK;
}

KVR_API void kvr_kv_pool_free(kvr_kv_pool* pool) { delete pool; }

KVR_API uint32_t kvr_kv_pool_blocks_total(const kvr_kv_pool* pool) {
  return pool ? static_cast<uint32_t>(pool->pool->n_blocks) : 0;
}

KVR_API uint32_t kvr_kv_pool_blocks_free(const kvr_kv_pool* pool) {
  return pool ? static_cast<uint32_t>(pool->pool->free_count()) : 0;
}

KVR_API uint32_t kvr_kv_pool_block_tokens(const kvr_kv_pool* pool) {
  return pool ? static_cast<uint32_t>(pool->pool->block_tokens) : 0;
}

KVR_API uint64_t kvr_kv_pool_block_bytes(const kvr_kv_pool* pool) { return pool ? pool->pool->block_bytes : 0; }

KVR_API int32_t kvr_seq_create_paged(kvr_kv_pool* pool, uint32_t capacity, kvr_seq** out_seq) {
  if (!out_seq) return fail(KVR_ERR_INVALID_ARGUMENT, "out_seq is NULL");
  *out_seq = nullptr;
  if (!pool) return fail(KVR_ERR_INVALID_ARGUMENT, "pool is NULL");
  if (capacity == 0) return fail(KVR_ERR_INVALID_ARGUMENT, "capacity must be >= 1, got 0");
  try {
    auto* seq = new kvr_seq;
    seq->model = pool->model;
    kvr::KvCache& kv = seq->kv;
    const kvr::KvPool& p = *pool->pool;
    kv.dtype = p.dtype;
    kv.elem = p.elem;
    kv.layers = p.layers;
    kv.kv_heads = p.kv_heads;
    kv.head_dim = p.head_dim;
    kv.capacity = capacity;
    kv.pool = pool->pool;
    *out_seq = seq;
  } catch (const std::bad_alloc&) {
    return fail(KVR_ERR_OUT_OF_MEMORY, "out of memory creating a sequence");
  }
  return KVR_OK;
}

KVR_API uint32_t kvr_seq_blocks(const kvr_seq* seq) { return seq ? static_cast<uint32_t>(seq->kv.table.size()) : 0; }

KVR_API int32_t kvr_batch_step(kvr_seq* const* seqs, uint32_t n_seqs, const uint32_t* n_tokens, const int32_t* tokens,
                               size_t tokens_len, const uint32_t* want_logits, float* logits_out, size_t logits_len) {
  try {
    return kvr::batch_impl(seqs, n_seqs, n_tokens, tokens, tokens_len, want_logits, logits_out, logits_len);
  } catch (const std::bad_alloc&) {
    return kvr::batch_fail(seqs, seqs ? n_seqs : 0, KVR_ERR_OUT_OF_MEMORY, "out of memory in batch_step");
  } catch (const std::exception& e) {
    return kvr::batch_fail(seqs, seqs ? n_seqs : 0, KVR_ERR_INTERNAL,
                           format("internal error in batch_step: %s", e.what()));
  } catch (...) {
    return kvr::batch_fail(seqs, seqs ? n_seqs : 0, KVR_ERR_INTERNAL, "internal error in batch_step");
  }
}

}  // extern "C"
