// The paged KV pool of one model: a fixed arena of `n_blocks` blocks of `block_tokens` positions,
// each block laid out (layer, {K,V}, kv_head, block_tokens, head_dim) in the model's kv_dtype, a
// free list and a reference count per block. A block is held by every sequence whose table lists
// it and by every external reference (kvr_kv_pool_ref: the prefix cache); it returns to the free
// list only when its count reaches zero, so a shared block is never handed out twice. Thread-safe
// (one mutex around the counts and the free list): sequences of one pool may grow and shrink from
// different threads. Not the block table (kv_cache.h) nor the C handle (kv_share.cpp, batch.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/errors.h"

namespace kvr {

struct KvPool final : PoolState {
  uint32_t dtype = 0;
  size_t elem = 4, layers = 0, kv_heads = 0, head_dim = 0;
  size_t tokens_per_block = 0, n_blocks = 0;
  size_t bytes_per_block = 0;  // 2 · layers · kv_heads · tokens_per_block · head_dim · elem
  uint8_t* data = nullptr;  // n_blocks · bytes_per_block, owned (calloc/free)

  KvPool() = default;
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
  ~KvPool() override { std::free(data); }

  uint32_t blocks_total() const override { return static_cast<uint32_t>(n_blocks); }
  uint32_t blocks_free() const override { return static_cast<uint32_t>(free_count()); }
  uint32_t block_tokens() const override { return static_cast<uint32_t>(tokens_per_block); }
  uint64_t block_bytes() const override { return bytes_per_block; }
  KvPool& block_list() override { return *this; }

  // Fills the free list with every block (ids descending so take() hands out low ids first);
  // every count starts at zero. Throws std::bad_alloc.
  void init_free_list() {
    free_.resize(n_blocks);
    refs_.assign(n_blocks, 0);
    for (size_t i = 0; i < n_blocks; ++i) free_[i] = static_cast<uint32_t>(n_blocks - 1 - i);
  }
  size_t free_count() const {
    std::lock_guard<std::mutex> g(mu_);
    return free_.size();
  }
  // The holders of block id now (0: free). id < n_blocks.
  uint32_t refs(uint32_t id) const {
    std::lock_guard<std::mutex> g(mu_);
    return refs_[id];
  }
  // Appends n free block ids to out, each with count 1 (the taker's), all or none (out must have
  // room reserved: no throw here).
  bool take(size_t n, std::vector<uint32_t>& out) {
    std::lock_guard<std::mutex> g(mu_);
    if (free_.size() < n) return false;
    for (size_t i = 0; i < n; ++i) {
      out.push_back(free_.back());
      refs_[free_.back()] = 1;
      free_.pop_back();
    }
    return true;
  }
  // Drops one reference from each of n held block ids (a sequence's table, trusted); a block whose
  // count reaches zero goes back to the free list (capacity for every block is reserved: no
  // throw). An id already free is skipped, so the free list never holds an id twice.
  void release(const uint32_t* ids, size_t n) {
    if (n == 0) return;
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t id = ids[i];
      if (id >= n_blocks || refs_[id] == 0) continue;
      if (--refs_[id] == 0) free_.push_back(id);
    }
  }
  // Adds one reference to each of n ids from a caller (kvr_kv_pool_ref, kvr_seq_adopt), all or
  // none: every id must be < n_blocks and held (count > 0; a free block cannot be shared). On
  // failure returns false with the reason in err and changes nothing.
  bool ref(const uint32_t* ids, size_t n, std::string& err) {
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t id = ids[i];
      if (id >= n_blocks) return fail_with(err, format("block id %u at index %zu is out of range [0, %zu)", id, i, n_blocks));
      if (refs_[id] == 0) return fail_with(err, format("block %u at index %zu is free (nothing holds it)", id, i));
      if (refs_[id] > kMaxRefs - n) return fail_with(err, format("block %u at index %zu has too many holders", id, i));
    }
    for (size_t i = 0; i < n; ++i) ++refs_[ids[i]];
    return true;
  }
  // Drops one reference from each of n ids from a caller (kvr_kv_pool_unref), all or none: every
  // id must be < n_blocks and hold at least as many references as it appears in ids. Blocks
  // reaching zero return to the free list. On failure returns false with err; nothing changes.
  bool unref(const uint32_t* ids, size_t n, std::string& err) {
    std::lock_guard<std::mutex> g(mu_);
    size_t i = 0, pushed = 0;
    for (; i < n; ++i) {
      const uint32_t id = ids[i];
      if (id >= n_blocks || refs_[id] == 0) break;
      if (--refs_[id] == 0) {
        free_.push_back(id);  // capacity n_blocks: a block is on the list at most once
        ++pushed;
      }
    }
    if (i == n) return true;
    free_.resize(free_.size() - pushed);  // undo: the pushed ids are the list's last ones
    for (size_t j = 0; j < i; ++j) ++refs_[ids[j]];
    if (ids[i] >= n_blocks)
      return fail_with(err, format("block id %u at index %zu is out of range [0, %zu)", ids[i], i, n_blocks));
    return fail_with(err, format("block %u at index %zu has no reference left to drop", ids[i], i));
  }

  // Makes table hold positions [0, tokens) with [from, tokens) writable by this holder alone:
  // takes the missing blocks and, for each block of [from, tokens) already in the table that
  // another holder shares, a fresh block that copy(dst_id, src_id) fills before the table points
  // at it and the shared one loses this holder's reference (copy on write). All or none: false
  // when the free list is short (nothing changes). copy may throw; the fresh blocks then go back
  // and the table is unchanged. Throws std::bad_alloc (before any change).
  template <class Copy>
  bool prepare_write(std::vector<uint32_t>& table, size_t from, size_t tokens, Copy&& copy) {
    const size_t bt = tokens_per_block;
    const size_t want = (tokens + bt - 1) / bt;
    const size_t missing = want > table.size() ? want - table.size() : 0;
    std::vector<size_t> slots;  // table indices of shared blocks in the written range
    {
      std::lock_guard<std::mutex> g(mu_);
      if (from < tokens)
        for (size_t b = from / bt; b < std::min(want, table.size()); ++b)
          if (refs_[table[b]] > 1) slots.push_back(b);
      if (slots.empty() && missing == 0) return true;
      if (free_.size() < slots.size() + missing) return false;
    }
    table.reserve(want);
    if (slots.empty()) return take(missing, table);
    std::vector<uint32_t> fresh;
    fresh.reserve(slots.size());
    if (!take(slots.size(), fresh)) return false;  // another holder took them meanwhile
    try {
      for (size_t k = 0; k < slots.size(); ++k) copy(fresh[k], table[slots[k]]);
    } catch (...) {
      release(fresh.data(), fresh.size());
      throw;
    }
    if (missing > 0 && !take(missing, table)) {
      release(fresh.data(), fresh.size());
      return false;
    }
    for (size_t k = 0; k < slots.size(); ++k) {
      release(&table[slots[k]], 1);
      table[slots[k]] = fresh[k];
    }
    return true;
  }

 private:
  static constexpr uint32_t kMaxRefs = 0xFFFFFFFFu;
  static bool fail_with(std::string& err, std::string msg) {
    err = std::move(msg);
    return false;
  }

  mutable std::mutex mu_;
  std::vector<uint32_t> free_;  // capacity n_blocks after init_free_list
  std::vector<uint32_t> refs_;  // (n_blocks) holders of each block; 0 = on the free list
};

}  // namespace kvr
