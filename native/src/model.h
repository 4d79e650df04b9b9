// The loaded model: validated geometry plus weights in compute layout (linear weights pre-packed
// for cpu::matmul_xwt, bf16 when the checkpoint's are BF16, else f32; q/k/v and gate/up fused
// into one packed weight each; norms and biases f32).
// Immutable after load, shared by every sequence (std::shared_ptr), so concurrent calls on
// different sequences never write to it. Not the loader itself (model_load.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/gemm.h"
#include "kvrelay.h"

namespace kvr {

struct LayerWeights {
  std::vector<float> attn_norm;     // (hidden)
  std::vector<float> mlp_norm;      // (hidden)
  std::vector<float> q_norm;        // (head_dim), Qwen3 only, else empty
  std::vector<float> k_norm;        // (head_dim), Qwen3 only, else empty
  cpu::PackedWeight qkv;            // rows (q_dim + 2*kv_dim) = [q; k; v], cols hidden
  std::vector<float> qkv_bias;      // (q_dim + 2*kv_dim) or empty
  cpu::PackedWeight o;              // (hidden, q_dim)
  std::vector<float> o_bias;        // (hidden) or empty
  cpu::PackedWeight gate_up;        // rows (2*intermediate) = [gate; up], cols hidden
  std::vector<float> gate_up_bias;  // (2*intermediate) or empty
  cpu::PackedWeight down;           // (hidden, intermediate)
  std::vector<float> down_bias;     // (hidden) or empty
};

struct Model {
  kvr_model_params params{};  // validated; n_threads resolved below
  int n_threads = 1;
  size_t vocab = 0, hidden = 0, inter = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  size_t q_dim = 0, kv_dim = 0;  // heads*head_dim, kv_heads*head_dim
  // Token lookup table (vocab, hidden) row-major: exactly one of the two is non-empty
  // (embed_bf16 when the checkpoint's embedding is BF16 and KVRELAY_WEIGHTS_F32 is not 1).
  std::vector<float> embed;          // f32
  std::vector<uint16_t> embed_bf16;  // bf16 bit patterns, widened exactly on lookup
  std::vector<float> final_norm; // (hidden)
  cpu::PackedWeight lm_head;     // (vocab, hidden); a packed copy of the embedding when tied
  std::vector<LayerWeights> layer;
  std::vector<double> inv_freq;  // (head_dim/2) RoPE inverse frequencies after rope_scaling, rad/token
};

}  // namespace kvr

struct kvr_model {
  std::shared_ptr<const kvr::Model> m;
};
