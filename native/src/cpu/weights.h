// The CPU backend's weights in compute layout: linear weights pre-packed for cpu::matmul_xwt
// (bf16 panels when the checkpoint's are BF16, else f32; q/k/v and gate/up fused into one packed
// weight each), norms and biases f32. Built once by cpu_backend.cpp, read-only afterwards.
// Not the geometry (backend.h ModelGeometry) nor the packing code (gemm.h).
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/gemm.h"

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

struct Weights {
  // Token lookup table (vocab, hidden) row-major: exactly one of the two is non-empty
  // (embed_bf16 when the checkpoint's embedding is BF16 and KVRELAY_WEIGHTS_F32 is not 1).
  std::vector<float> embed;          // f32
  std::vector<uint16_t> embed_bf16;  // bf16 bit patterns, widened exactly on lookup
  std::vector<float> final_norm;     // (hidden)
  PackedWeight lm_head;              // (vocab, hidden); a packed copy of the embedding when tied
  std::vector<LayerWeights> layer;
};

}  // namespace kvr::cpu
