// The paged KV pool of one model: a fixed arena of `n_blocks` blocks of `block_tokens` positions,
// each block laid out (layer, {K,V}, kv_head, block_tokens, head_dim) in the model's kv_dtype, and
// a free list. Sequences hold block tables into it (kv_cache.h). Thread-safe (one mutex around the
// free list): sequences of one pool may grow and shrink from different threads.
// Not the block table (kv_cache.h) nor the C handle (kv_pool.cpp: kvr_kv_pool_*).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "backend.h"

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

  // Fills the free list with every block (ids descending so take() hands out low ids first).
  void init_free_list() {
    free_.resize(n_blocks);
    for (size_t i = 0; i < n_blocks; ++i) free_[i] = static_cast<uint32_t>(n_blocks - 1 - i);
  }
  size_t free_count() const {
    std::lock_guard<std::mutex> g(mu_);
    return free_.size();
  }
  // Appends n free block ids to out, all or none (out must have room reserved: no throw here).
  bool take(size_t n, std::vector<uint32_t>& out) {
    std::lock_guard<std::mutex> g(mu_);
    if (free_.size() < n) return false;
    for (size_t i = 0; i < n; ++i) {
      out.push_back(free_.back());
      free_.pop_back();
    }
    return true;
  }
  // Returns n block ids to the free list (capacity for every block is reserved: no throw).
  void release(const uint32_t* ids, size_t n) {
    if (n == 0) return;
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < n; ++i) free_.push_back(ids[i]);
  }

 private:
  mutable std::mutex mu_;
  std::vector<uint32_t> free_;  // capacity n_blocks after init_free_list
};

}  // namespace kvr
