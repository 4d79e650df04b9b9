// A sequence's KV cache: for every layer, K and V as (kv_heads, capacity, head_dim) in the
// model's kv_dtype, K post-RoPE. One calloc'ed block laid out (layer, {K,V}, kv_head, pos, dim).
// Not the read/write API (sequence.cpp) nor attention (cpu/attention.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace kvr {

struct KvCache {
  uint32_t dtype = 0;
  size_t elem = 4;  // bytes per element
  size_t layers = 0, kv_heads = 0, head_dim = 0, capacity = 0;
  uint8_t* data = nullptr;  // owned (calloc/free)

  KvCache() = default;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache() { std::free(data); }

  size_t head_bytes() const { return capacity * head_dim * elem; }          // one (pos, dim) plane
  size_t plane_bytes() const { return kv_heads * head_bytes(); }            // one layer's K or V
  uint8_t* k(size_t layer) const { return data + (2 * layer) * plane_bytes(); }
  uint8_t* v(size_t layer) const { return data + (2 * layer + 1) * plane_bytes(); }
};

}  // namespace kvr
