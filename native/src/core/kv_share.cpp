// Block sharing in a paged KV pool (kvr_seq_block_table, kvr_seq_adopt, kvr_kv_pool_ref,
// kvr_kv_pool_unref): a sequence's block ids, a new sequence starting from blocks that already
// hold KV (a prefix-cache hit, a forked choice) with no copy, and references a caller (the prefix
// cache) holds on blocks. Every id and count is checked here; the counts live in the pool
// (kv_pool.h), and a write into a shared block copies it first (Backend::reserve).
// Not the pool's free list (kv_pool.h), the block table (kv_cache.h) nor the cache's names (TS).
#include <algorithm>
#include <new>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/errors.h"
#include "core/kv_pool.h"
#include "core/kv_pool_handle.h"
#include "core/model.h"
#include "core/sequence.h"

namespace kvr {
namespace {

// Every id < n_blocks, else KVR_ERR_OUT_OF_RANGE naming the first bad one.
int32_t check_ids(const char* fn, const uint32_t* ids, uint32_t n, uint32_t n_blocks) {
  for (uint32_t i = 0; i < n; ++i)
    if (ids[i] >= n_blocks)
      return fail(KVR_ERR_OUT_OF_RANGE,
                  format("%s: block id %u at index %u is out of range [0, %u)", fn, ids[i], i, n_blocks));
  return KVR_OK;
}

int32_t adopt_impl(kvr_seq* seq, const uint32_t* ids, uint32_t n_blocks, uint32_t n_tokens) {
  const char* fn = "kvr_seq_adopt";
  const Backend& be = *seq->model->backend;
  const PagedView pv = be.paged(*seq->state);
  if (!pv.table) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("%s: the sequence is not paged", fn));
  if (seq->length != 0 || !pv.table->empty())
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT,
                    format("%s: the sequence must be empty, holds %u tokens in %zu blocks", fn, seq->length,
                           pv.table->size()));
  if (n_tokens > seq->capacity)
    return seq_fail(seq, KVR_ERR_CAPACITY,
                    format("%s: n_tokens %u exceeds the sequence's capacity %u", fn, n_tokens, seq->capacity));
  const uint32_t bt = pv.pool->block_tokens();
  const uint64_t want = (static_cast<uint64_t>(n_tokens) + bt - 1) / bt;
  if (n_blocks != want)
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT,
                    format("%s: %u tokens need %llu blocks of %u tokens, got n_blocks %u", fn, n_tokens,
                           (unsigned long long)want, bt, n_blocks));
  if (n_blocks == 0) return KVR_OK;
  if (!ids) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("%s: ids is NULL", fn));
  for (uint32_t i = 0; i < n_blocks; ++i)
    if (ids[i] >= pv.pool->blocks_total())
      return seq_fail(seq, KVR_ERR_OUT_OF_RANGE, format("%s: block id %u at index %u is out of range [0, %u)", fn,
                                                         ids[i], i, pv.pool->blocks_total()));
  std::vector<uint32_t> sorted(ids, ids + n_blocks);
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end())
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("%s: block %u appears twice in ids", fn, *dup));
  pv.table->reserve(n_blocks);  // may throw before any count changes
  std::string err;
  if (!pv.pool->block_list().ref(ids, n_blocks, err))
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("%s: %s", fn, err.c_str()));
  pv.table->assign(ids, ids + n_blocks);
  seq->length = n_tokens;
  return KVR_OK;
}

// kvr_kv_pool_ref / kvr_kv_pool_unref.
int32_t pool_refs(const char* fn, kvr_kv_pool* pool, const uint32_t* ids, uint32_t n, bool add) {
  if (!pool) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: pool is NULL", fn));
  if (n == 0) return KVR_OK;
  if (!ids) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: ids is NULL", fn));
  if (int32_t st = check_ids(fn, ids, n, pool->pool->blocks_total())) return st;
  std::string err;
  KvPool& kp = pool->pool->block_list();
  if (!(add ? kp.ref(ids, n, err) : kp.unref(ids, n, err)))
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: %s", fn, err.c_str()));
  return KVR_OK;
}

}  // namespace
}  // namespace kvr

using kvr::fail;
using kvr::format;

extern "C" {

KVR_API int32_t kvr_seq_block_table(const kvr_seq* cseq, uint32_t* ids, uint32_t cap, uint32_t* n) {
  const char* fn = "kvr_seq_block_table";
  if (!cseq) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: seq is NULL", fn));
  if (!n) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: n is NULL", fn));
  *n = 0;
  kvr_seq* seq = const_cast<kvr_seq*>(cseq);  // only last_error is written
  const kvr::PagedView pv = seq->model->backend->paged(*seq->state);
  if (!pv.table) return kvr::seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("%s: the sequence is not paged", fn));
  const size_t held = pv.table->size();
  *n = static_cast<uint32_t>(held);
  if (held > cap)
    return kvr::seq_fail(seq, KVR_ERR_CAPACITY,
                         format("%s: cap %u is too small: the sequence holds %zu blocks", fn, cap, held));
  if (held > 0 && !ids) return kvr::seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("%s: ids is NULL", fn));
  std::copy(pv.table->begin(), pv.table->end(), ids);
  return KVR_OK;
}

KVR_API int32_t kvr_seq_adopt(kvr_seq* seq, const uint32_t* ids, uint32_t n_blocks, uint32_t n_tokens) {
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "kvr_seq_adopt: seq is NULL");
  return kvr::seq_guarded(seq, "kvr_seq_adopt", [&] { return kvr::adopt_impl(seq, ids, n_blocks, n_tokens); });
}

KVR_API int32_t kvr_kv_pool_ref(kvr_kv_pool* pool, const uint32_t* ids, uint32_t n) {
  return kvr::pool_refs("kvr_kv_pool_ref", pool, ids, n, true);
}

KVR_API int32_t kvr_kv_pool_unref(kvr_kv_pool* pool, const uint32_t* ids, uint32_t n) {
  return kvr::pool_refs("kvr_kv_pool_unref", pool, ids, n, false);
}

}  // extern "C"
