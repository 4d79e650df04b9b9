// Causal multi-head attention (GQA) of a block of new queries against a layer's KV cache, CPU.
// Flash-style: key tiles converted from the cache dtype to f32, online softmax in f32 with max
// subtraction. Not RoPE, not the KV write (the layer loop, cpu/batch_forward.cpp, does both
// first). The caller's threads split the work by kv head and query block (one unit each).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/kv_cache.h"

namespace kvr::cpu {

// Queries per work item (× the GQA group's heads = rows of one pass over the keys): a caller
// splitting a chunk's queries into units of this many reads the keys once each.
constexpr size_t kAttnQueryBlock = 24;

struct AttnArgs {
  const float* q = nullptr;      // (n, heads*head_dim) rows with stride ldq, post-RoPE
  size_t ldq = 0;
  const KvCache* kv = nullptr;   // keys post-RoPE, read through kv->at (contiguous or paged)
  size_t layer = 0;
  size_t n = 0, pos0 = 0;        // query i is at position pos0+i and sees keys [0, pos0+i]
  size_t heads = 0, kv_heads = 0, head_dim = 0;
  float* out = nullptr;          // (n, heads*head_dim) rows with stride ldo
  size_t ldo = 0;
};

// Every query row of kv head g's GQA group, all keys on the calling thread in one segment (so the
// result never depends on how a caller splits heads over threads). Writes only those heads'
// columns of out. scratch has
// attention_group_scratch_floats(a) floats, private to the calling thread.
size_t attention_group_scratch_floats(const AttnArgs& a);
void attention_group(const AttnArgs& a, size_t g, float* scratch);

}  // namespace kvr::cpu
