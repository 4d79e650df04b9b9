// Attention of one new query position (a decode) against its sequence's whole KV cache, on the
// calling thread, for the batched step (batch_forward.cpp): every key scored in one pass over the
// cache's contiguous runs (a paged cache's blocks), one softmax per head, then one pass over the
// values. Not the flash-style attention() (attention.h), whose tiles are at most one block (16
// positions in a paged pool) and pay an online-softmax rescale each — most of the work for a
// short decode context. Same math up to float summation order.
#pragma once

#include <cstddef>

#include "cpu/attention.h"

namespace kvr::cpu {

// Floats of scratch decode_attention() needs for these arguments (a.n == 1).
size_t decode_attention_scratch_floats(const AttnArgs& a);

// out = softmax(q·kᵀ/sqrt(head_dim)) · v over keys [0, pos0] for the single query of `a`
// (a.n == 1; a.n_threads is ignored). scratch has decode_attention_scratch_floats(a) floats.
// Does not allocate or throw.
void decode_attention(const AttnArgs& a, float* scratch);

// The same for the query heads of kv head g's GQA group only (g < a.kv_heads): writes only their
// columns of out, on the calling thread, with the same scratch; decode_attention runs it for every
// group. A caller splitting one group's heads over threads passes a group of one head
// (heads = kv_heads) with q and out shifted to that head (cpu/decode_step.cpp).
void decode_attention_group(const AttnArgs& a, size_t g, float* scratch);

}  // namespace kvr::cpu
