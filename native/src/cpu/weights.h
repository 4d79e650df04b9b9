// The CPU backend's weights in compute layout: linear weights pre-packed for cpu::matmul_xwt
// (bf16 panels when the checkpoint's are BF16, else f32; q/k/v and gate/up fused into one packed
// weight each), norms and biases f32. Built once by cpu_backend.cpp, read-only afterwards.
// Not the geometry (backend.h ModelGeometry) nor the packing code (gemm.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "host/convert.h"
#include "host/dtype.h"
#include "host/gemm.h"

namespace kvr::cpu {

struct LayerWeights {
  std::vector<float> attn_norm;     // (hidden)
  std::vector<float> mlp_norm;      // (hidden)
  std::vector<float> q_norm;        // (head_dim), Qwen3 only, else empty
  std::vector<float> k_norm;        // (head_dim), Qwen3 only, else empty
  PackedWeight qkv;                 // rows (q_dim + 2*kv_dim) = [q; k; v], cols hidden
  std::vector<float> qkv_bias;      // (q_dim + 2*kv_dim) or empty
  PackedWeight o;                   // (hidden, q_dim)
  std::vector<float> o_bias;        // (hidden) or empty
  PackedWeight gate_up;             // rows (2*intermediate) = [gate; up], cols hidden
  std::vector<float> gate_up_bias;  // (2*intermediate) or empty
  PackedWeight down;                // (hidden, intermediate)
  std::vector<float> down_bias;     // (hidden) or empty
};

// A number no other Weights of this process gets: keys per-model state such as the decode tuner's
// last choice (an address can be reused once a model is freed).
inline uint64_t next_weights_uid() {
  static std::atomic<uint64_t> n{0};
  return n.fetch_add(1, std::memory_order_relaxed) + 1;
}

struct Weights {
  uint64_t uid = next_weights_uid();
  // Token lookup table (vocab, hidden) row-major: at most one of the two is non-empty
  // (embed_bf16 when the checkpoint's embedding is BF16 and not widened by the test switch). Both
  // are empty when the embedding is tied: lookups then read the lm_head panels (embed_row), so the
  // table is held once, not twice (q8/q4 weights: the lookups see the dequantized values).
  std::vector<float> embed;          // f32
  std::vector<uint16_t> embed_bf16;  // bf16 bit patterns, widened exactly on lookup
  std::vector<float> final_norm;     // (hidden)
  PackedWeight lm_head;              // (vocab, hidden); the embedding itself when tied
  std::vector<LayerWeights> layer;
};

// x (hidden floats) = the embedding row of token tok, exact (bf16 widened; q8/q4 tied: dequantized).
inline void embed_row(const Weights& w, size_t tok, size_t hidden, float* x) {
  if (!w.embed_bf16.empty()) {
    to_f32(w.embed_bf16.data() + tok * hidden, KVR_DTYPE_BF16, x, hidden);
  } else if (!w.embed.empty()) {
    const float* row = w.embed.data() + tok * hidden;
    for (size_t i = 0; i < hidden; ++i) x[i] = row[i];
  } else {
    w.lm_head.row_f32(tok, x);
  }
}

}  // namespace kvr::cpu
