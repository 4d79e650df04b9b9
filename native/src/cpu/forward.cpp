// CPU forward pass (see forward.h). Prefill runs in chunks of up to kChunk tokens so scratch stays
// bounded; each chunk does batched GEMMs (cpu::matmul_xwt) over all its tokens and blocked
// attention; only the requested rows go through the lm_head. Row-wise ops run on the worker pool
// (parallel_for.h).
#include "cpu/forward.h"

#include <algorithm>
#include <cmath>

#include "common/device_math.h"
#include "cpu/attention.h"
#include "cpu/convert.h"
#include "cpu/decode_step.h"
#include "cpu/gemm.h"
#include "cpu/ops.h"
#include "cpu/parallel_for.h"
#include "rope.h"

namespace kvr::cpu {
namespace {

constexpr size_t kChunk = 256;  // tokens per prefill chunk

void forward_chunk(const ModelGeometry& m, const Weights& w, KvCache& kv, const int32_t* tokens, size_t n, size_t pos0, float* logits,
                   size_t logit_row0, size_t logit_rows, Scratch& sc) {
  const size_t H = m.hidden, I = m.inter, hd = m.head_dim, half = hd / 2;
  const size_t qd = m.q_dim, kvd = m.kv_dim, ldqkv = qd + 2 * kvd;
  const int nt = m.n_threads;
  // Below this a region costs more than it saves.
  const int row_team = n > 1 && n * m.hidden >= 16384 ? nt : 1;
  const float eps = m.params.rms_norm_eps;
  const bool qwen3 = m.params.arch == KVR_ARCH_QWEN3;

  const size_t need = n * (2 * H + ldqkv + qd + 2 * I + hd);
  if (sc.main.size() < need) sc.main.resize(need);
  float* x = sc.main.data();     // (n, H) residual stream
  float* h = x + n * H;          // (n, H) normed
  float* qkv = h + n * H;        // (n, q_dim + 2 kv_dim)
  float* att = qkv + n * ldqkv;  // (n, q_dim)
  float* gu = att + n * qd;      // (n, 2I): [gate | up], then act in the gate half
  float* cs = gu + n * 2 * I;    // (n, hd): cos (half) then sin (half) per token

  AttnArgs aa;
  aa.q = qkv;
  aa.ldq = ldqkv;
  aa.kv = &kv;
  aa.n = n;
  aa.pos0 = pos0;
  aa.heads = m.heads;
  aa.kv_heads = m.kv_heads;
  aa.head_dim = hd;
  aa.out = att;
  aa.ldo = qd;
  aa.n_threads = nt;
  aa.workers = Workers::kPool;
  const size_t attn_need = attention_scratch_floats(aa);
  if (sc.attn.size() < attn_need) sc.attn.resize(attn_need);

  // Embeddings and RoPE tables (double precision angles, rounded to f32).
  parallel_static(Workers::kPool, row_team, n, [&](size_t i, unsigned) {
    embed_row(w, static_cast<size_t>(tokens[i]), H, x + i * H);
    // The CUDA backend computes the same bits (common/device_math.h via rope.h).
    rope_cos_sin_rows(m.inv_freq, pos0 + i, 1, cs + i * hd, hd);
  });

  for (size_t l = 0; l < m.layers; ++l) {
    const LayerWeights& L = w.layer[l];

    parallel_static(Workers::kPool, row_team, n, [&](size_t i, unsigned) { rmsnorm(x + i * H, h + i * H, L.attn_norm.data(), H, eps); });
    matmul_xwt(h, n, H, L.qkv, qkv, ldqkv, false, nt, Workers::kPool);

    parallel_static(Workers::kPool, row_team, n, [&](size_t i, unsigned) {
      float* row = qkv + i * ldqkv;
      if (!L.qkv_bias.empty()) add_inplace(row, L.qkv_bias.data(), ldqkv);
      float* kr = row + qd;
      float* vr = row + qd + kvd;
      if (qwen3) {
        for (size_t hh = 0; hh < m.heads; ++hh) rmsnorm(row + hh * hd, row + hh * hd, L.q_norm.data(), hd, eps);
        for (size_t g = 0; g < m.kv_heads; ++g) rmsnorm(kr + g * hd, kr + g * hd, L.k_norm.data(), hd, eps);
      }
      const float* c = cs + i * hd;
      for (size_t hh = 0; hh < m.heads; ++hh) rope(row + hh * hd, c, c + half, half);
      for (size_t g = 0; g < m.kv_heads; ++g) {
        rope(kr + g * hd, c, c + half, half);
        from_f32(kr + g * hd, kv.dtype, kv.at(l, 0, g, pos0 + i), hd);
        from_f32(vr + g * hd, kv.dtype, kv.at(l, 1, g, pos0 + i), hd);
      }
    });

    aa.layer = l;
    attention(aa, sc.attn.data());

    matmul_xwt(att, n, qd, L.o, x, H, true, nt, Workers::kPool);
    if (!L.o_bias.empty())
      for (size_t i = 0; i < n; ++i) add_inplace(x + i * H, L.o_bias.data(), H);

    parallel_static(Workers::kPool, row_team, n, [&](size_t i, unsigned) { rmsnorm(x + i * H, h + i * H, L.mlp_norm.data(), H, eps); });
    matmul_xwt(h, n, H, L.gate_up, gu, 2 * I, false, nt, Workers::kPool);
    parallel_static(Workers::kPool, row_team, n, [&](size_t i, unsigned) {
      float* row = gu + i * 2 * I;
      if (!L.gate_up_bias.empty()) add_inplace(row, L.gate_up_bias.data(), 2 * I);
      swiglu(row, row + I, row, I);
    });
    matmul_xwt(gu, n, 2 * I, L.down, x, H, true, nt, Workers::kPool);
    if (!L.down_bias.empty())
      for (size_t i = 0; i < n; ++i) add_inplace(x + i * H, L.down_bias.data(), H);
  }

  if (logit_rows == 0) return;
  for (size_t r = 0; r < logit_rows; ++r)
    rmsnorm(x + (logit_row0 + r) * H, h + r * H, w.final_norm.data(), H, eps);
  matmul_xwt(h, logit_rows, H, w.lm_head, logits, m.vocab, false, nt, Workers::kPool);
}

}  // namespace

void forward(const ModelGeometry& m, const Weights& w, KvCache& kv, const int32_t* tokens, size_t n, size_t pos0, bool all_positions,
             float* logits, Scratch& scratch) {
  if (n == 1) {  // decode: one parallel region for the whole step (cpu/decode_step.cpp)
    decode_tuned(m, w, kv, tokens[0], pos0, logits, scratch, scratch.tuner);
    return;
  }
  for (size_t c = 0; c < n; c += kChunk) {
    const size_t nc = std::min(kChunk, n - c);
    const bool last = c + nc == n;
    if (all_positions) {
      forward_chunk(m, w, kv, tokens + c, nc, pos0 + c, logits + c * m.vocab, 0, nc, scratch);
    } else {
      forward_chunk(m, w, kv, tokens + c, nc, pos0 + c, logits, nc - 1, last ? 1 : 0, scratch);
    }
  }
}

}  // namespace kvr::cpu
