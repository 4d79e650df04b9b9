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

// Positions per block: the attention of a decode is computed in fixed blocks of positions (scores
// and partial results per block, added in block order), so a caller may spread one GQA group's
// blocks over threads (cpu/batch_forward.cpp, one row) and still get the bits of one thread.
constexpr size_t kDecodeBlock = 64;

// Floats of scratch decode_attention() needs for these arguments (a.n == 1).
size_t decode_attention_scratch_floats(const AttnArgs& a);

// One GQA group's intermediate results over its blocks, in caller memory (decode_parts_floats).
struct DecodeParts {
  size_t nb = 0;          // blocks: ceil((pos0 + 1) / kDecodeBlock)
  size_t ldS = 0, ldA = 0;
  float* S = nullptr;     // (group, ldS) scores, then exp(score - head max)
  float* bmax = nullptr;  // (group, round16(nb)) max score per block
  float* bsum = nullptr;  // (group, round16(nb)) Σ exp per block
  float* bacc = nullptr;  // (group, nb, ldA) Σ p·v per block
};
size_t decode_blocks(const AttnArgs& a);
size_t decode_parts_floats(const AttnArgs& a);
DecodeParts decode_parts(const AttnArgs& a, float* base);
// Floats a thread needs to convert one block of f16/bf16 keys or values.
size_t decode_block_scratch_floats(const AttnArgs& a);

// The three phases of decode_attention_group for a caller spreading blocks over threads: every
// block's scores (q: the group's heads, head_dim apart, post-RoPE) before any block's values;
// every block's values before the combine, which writes the group's heads to out (head_dim apart).
// tmp: decode_block_scratch_floats(a) floats, private to the calling thread.
void decode_scores_block(const AttnArgs& a, size_t g, const float* q, size_t b, const DecodeParts& d, float* tmp);
void decode_values_block(const AttnArgs& a, size_t g, size_t b, const DecodeParts& d, float* tmp);
void decode_combine(const AttnArgs& a, size_t g, const DecodeParts& d, float* out);

// out = softmax(q·kᵀ/sqrt(head_dim)) · v over keys [0, pos0] for the single query of `a`
// (a.n == 1). scratch has decode_attention_scratch_floats(a) floats.
// Does not allocate or throw.
void decode_attention(const AttnArgs& a, float* scratch);

// The same for the query heads of kv head g's GQA group only (g < a.kv_heads): writes only their
// columns of out, on the calling thread, with the same scratch; decode_attention runs it for every
// group. It runs the three phases below in order, so a split over threads gives the same bits.
void decode_attention_group(const AttnArgs& a, size_t g, float* scratch);

}  // namespace kvr::cpu
