// A sequence's KV cache: for every layer, K and V in the model's kv_dtype, K post-RoPE. Two
// storages behind one address function (at/run): contiguous — one zeroed block laid out
// (layer, {K,V}, kv_head, pos, dim) of `capacity` positions, calloc'ed or taken from the model's
// KvRecycler (kv_recycle.h) — or paged — a block table into a shared KvPool (kv_pool.h) that
// grows block by block up to `capacity` positions.
// Not the read/write API (sequence.cpp) nor attention (cpu/attention.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/kv_pool.h"
#include "core/kv_recycle.h"

namespace kvr {

struct KvCache {
  uint32_t dtype = 0;
  size_t elem = 4;  // bytes per element
  size_t layers = 0, kv_heads = 0, head_dim = 0, capacity = 0;
  uint8_t* data = nullptr;  // contiguous storage, owned; nullptr when paged
  // Contiguous: where data goes back on destruction (nullptr: std::free) and its allocation size.
  std::shared_ptr<KvRecycler> recycler;
  size_t alloc_bytes = 0;
  // Contiguous: positions [0, written) of every (layer, K/V, head) plane may hold data — the
  // high-water mark of reserve(), which every writer (prefill, decode, kv_write, set_length, chunk
  // import, projection, batch step) calls before writing. Cleared before data is recycled.
  size_t written = 0;
  std::shared_ptr<KvPool> pool;  // paged storage: positions [i*bt, (i+1)*bt) live in table[i]
  std::vector<uint32_t> table;

  KvCache() = default;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache() {
    if (data != nullptr && recycler) {
      clear_written();
      recycler->give({data, alloc_bytes});
    } else {
      std::free(data);
    }
    if (pool) pool->release(table.data(), table.size());  // shared blocks stay with their other holders
  }

  // Contiguous: zeroes positions [0, written) of every plane (the rest was never written), so the
  // buffer is all-zero again — what KvRecycler::give requires.
  void clear_written() {
    const size_t n = std::min(written, capacity) * head_dim * elem;
    if (data == nullptr || n == 0) return;
    if (n == head_bytes()) {  // whole planes: one run
      std::memset(data, 0, 2 * layers * plane_bytes());
      return;
    }
    for (size_t plane = 0; plane < 2 * layers * kv_heads; ++plane) std::memset(data + plane * head_bytes(), 0, n);
  }

  bool paged() const { return pool != nullptr; }
  size_t head_bytes() const { return capacity * head_dim * elem; }  // contiguous: one (pos, dim) plane
  size_t plane_bytes() const { return kv_heads * head_bytes(); }    // contiguous: one layer's K or V
  // Contiguous only: a layer's K or V plane (kv_heads, capacity, head_dim).
  uint8_t* k(size_t layer) const { return data + (2 * layer) * plane_bytes(); }
  uint8_t* v(size_t layer) const { return data + (2 * layer + 1) * plane_bytes(); }

  // Address of (head_dim) elements of K (which = 0) or V (1) of kv head g at position p of a layer.
  // Paged: p must lie in a held block (p < held_tokens()).
  uint8_t* at(size_t layer, size_t which, size_t g, size_t p) const {
    const size_t plane = (2 * layer + which) * kv_heads + g;
    if (!pool) return data + plane * head_bytes() + p * head_dim * elem;
    const size_t bt = pool->tokens_per_block;
    return pool->data + table[p / bt] * pool->bytes_per_block + (plane * bt + p % bt) * head_dim * elem;
  }
  // Positions from p on that are contiguous in memory at at(.., p) (within p's block when paged).
  size_t run(size_t p) const { return pool ? pool->tokens_per_block - p % pool->tokens_per_block : capacity - p; }
  // Positions with storage now: capacity when contiguous, held blocks × block tokens when paged.
  size_t held_tokens() const { return pool ? table.size() * pool->tokens_per_block : capacity; }
  // Blocks a paged cache must add to hold positions [0, tokens) (0 when contiguous).
  size_t blocks_needed(size_t tokens) const {
    if (!pool) return 0;
    const size_t want = (tokens + pool->tokens_per_block - 1) / pool->tokens_per_block;
    return want > table.size() ? want - table.size() : 0;
  }
  // Makes positions [0, tokens) (from <= tokens <= capacity) addressable and [from, tokens)
  // writable: takes the missing blocks from the pool and copies each block of [from, tokens)
  // another holder shares into a block of its own first (copy on write), all or none (paged), or
  // raises `written` (contiguous). False when the pool has too few free blocks (nothing changes
  // then). Throws std::bad_alloc when the table cannot grow.
  bool reserve(size_t from, size_t tokens) {
    if (!pool) {
      if (tokens > written) written = tokens;
      return true;
    }
    KvPool& p = *pool;
    return p.prepare_write(table, from, tokens, [&p](uint32_t dst, uint32_t src) {
      std::memcpy(p.data + dst * p.bytes_per_block, p.data + src * p.bytes_per_block, p.bytes_per_block);
    });
  }
  // Drops this cache's reference to the blocks holding no position < tokens (paged; no-op when
  // contiguous): a block no other holder shares returns to the pool.
  void shrink(size_t tokens) {
    if (!pool) return;
    const size_t keep = (tokens + pool->tokens_per_block - 1) / pool->tokens_per_block;
    if (keep >= table.size()) return;
    pool->release(table.data() + keep, table.size() - keep);
    table.resize(keep);
  }
};

}  // namespace kvr
