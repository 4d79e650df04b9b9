// The CPU forward pass of one decoder-only transformer over a block of new tokens: embeddings,
// per layer RMSNorm → fused QKV GEMM (+bias) → Qwen3 q/k norm → RoPE → KV cache write → causal
// attention → O GEMM + residual → RMSNorm → fused gate/up GEMM → SwiGLU → down GEMM + residual,
// then final norm and lm_head for the requested rows. Inputs are validated by the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend.h"
#include "cpu/weights.h"
#include "kv_cache.h"

namespace kvr::cpu {

// Reusable buffers of one sequence (never shared between sequences).
struct Scratch {
  std::vector<float> main;  // activations of one chunk
  std::vector<float> attn;  // attention partials and per-thread tiles
};

// Appends tokens[0..n) at positions pos0..pos0+n-1 to kv (which must have room) and writes
// logits: all_positions ? (n, vocab) rows : the last position's (vocab). tokens are < vocab.
// Throws std::bad_alloc when scratch cannot grow (the cache's length is the caller's to update).
void forward(const ModelGeometry& m, const Weights& w, KvCache& kv, const int32_t* tokens, size_t n, size_t pos0, bool all_positions,
             float* logits, Scratch& scratch);

}  // namespace kvr::cpu
