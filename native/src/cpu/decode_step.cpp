// Decode step (see decode_step.h). Every thread runs the whole layer loop; the GEMVs are split by
// weight panels (each thread owns a fixed column range of every projection), attention by KV
// head, and the small row ops are either fused into the owner's range (biases, SwiGLU) or
// recomputed by every thread into its own buffer (RMSNorm of one row: cheaper than a barrier).
// Five barriers per layer: after QKV, attention, O, gate/up+SwiGLU and down.
#include "cpu/decode_step.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/device_math.h"
#include "cpu/attention.h"
#include "cpu/convert.h"
#include "cpu/gemm.h"
#include "cpu/ops.h"
#include "cpu/spin_barrier.h"

namespace kvr::cpu {
namespace {

// Range i of `parts` near-equal ranges of [0, count).
void split(size_t count, size_t parts, size_t i, size_t* begin, size_t* end) {
  const size_t base = count / parts, extra = count % parts;
  *begin = i * base + std::min(i, extra);
  *end = *begin + base + (i < extra ? 1 : 0);
}

// Panels [p0, p1) of w for y (+)= x · Wᵀ, then the bias on the same columns.
void gemv_part(const float* x, const PackedWeight& w, const std::vector<float>& bias, float* y,
               bool accumulate, size_t p0, size_t p1) {
  gemv_range(x, w, y, accumulate, p0, p1);
  if (bias.empty() || p0 >= p1) return;
  const size_t c0 = p0 * kPanelWidth, c1 = std::min(p1 * kPanelWidth, w.rows());
  add_inplace(y + c0, bias.data() + c0, c1 - c0);
}

}  // namespace

void decode_step(const ModelGeometry& m, const Weights& w, KvCache& kv, int32_t token, size_t pos, float* logits, Scratch& sc,
                 int n_threads) {
  const size_t H = m.hidden, I = m.inter, hd = m.head_dim, half = hd / 2;
  const size_t qd = m.q_dim, kvd = m.kv_dim, ldqkv = qd + 2 * kvd;
  const size_t group = m.heads / m.kv_heads;
  const float eps = m.params.rms_norm_eps;
  const bool qwen3 = m.params.arch == KVR_ARCH_QWEN3;
  const size_t nt = static_cast<size_t>(std::max(n_threads, 1));

  AttnArgs aa;
  aa.ldq = ldqkv;
  aa.kv = &kv;
  aa.n = 1;
  aa.pos0 = pos;
  aa.heads = m.heads;
  aa.kv_heads = m.kv_heads;
  aa.head_dim = hd;
  aa.ldo = qd;
  aa.n_threads = 1;
  const size_t attn_each = (attention_group_scratch_floats(aa) + 15) & ~size_t{15};
  const size_t h_each = (H + 15) & ~size_t{15};
  const size_t need = H + ldqkv + qd + 2 * I + hd + nt * h_each;
  if (sc.main.size() < need) sc.main.resize(need);
  if (sc.attn.size() < nt * attn_each) sc.attn.resize(nt * attn_each);
  float* x = sc.main.data();  // (H) residual stream, shared
  float* qkv = x + H;         // (q_dim + 2 kv_dim), shared
  float* att = qkv + ldqkv;   // (q_dim), shared
  float* gu = att + qd;       // (2I): [gate | up], SwiGLU written into the gate half
  float* cs = gu + 2 * I;     // (hd): cos (half) then sin (half)
  float* hbase = cs + hd;     // (nt, H): each thread's normed copy of x
  aa.q = qkv;
  aa.out = att;

  embed_row(w, static_cast<size_t>(token), H, x);
  // The same bits as the prefill path and the CUDA backend (common/device_math.h).
  for (size_t d = 0; d < half; ++d)
    dm::rope_cos_sin(static_cast<uint32_t>(pos), m.inv_freq[d], &cs[d], &cs[half + d]);

  // gate and up panels line up when I is a multiple of the panel width: the thread that owns
  // gate columns [c0, c1) also owns up columns [I + c0, I + c1) and applies SwiGLU there.
  const bool fused_swiglu = I % kPanelWidth == 0;
  SpinBarrier bar;

#pragma omp parallel num_threads(static_cast<int>(nt))
  {
    const size_t T = static_cast<size_t>(omp_get_num_threads());
    const size_t t = static_cast<size_t>(omp_get_thread_num());
    bar.arm(static_cast<unsigned>(T));
    float* h = hbase + t * h_each;
    float* as = sc.attn.data() + t * attn_each;
    size_t q0, q1, o0, o1, g0, g1, d0, d1, v0, v1;
    split(w.layer.empty() ? 0 : w.layer[0].qkv.panels(), T, t, &q0, &q1);
    split(w.layer.empty() ? 0 : w.layer[0].o.panels(), T, t, &o0, &o1);
    split(w.layer.empty() ? 0 : w.layer[0].down.panels(), T, t, &d0, &d1);
    split(m.kv_heads, T, t, &g0, &g1);
    split(w.lm_head.panels(), T, t, &v0, &v1);
    size_t u0, u1;  // gate/up panels (fused: gate panel range; else all panels)
    split(fused_swiglu ? I / kPanelWidth : (w.layer.empty() ? 0 : w.layer[0].gate_up.panels()), T, t,
          &u0, &u1);

    for (size_t l = 0; l < m.layers; ++l) {
      const LayerWeights& L = w.layer[l];
      rmsnorm(x, h, L.attn_norm.data(), H, eps);
      gemv_part(h, L.qkv, L.qkv_bias, qkv, false, q0, q1);
      bar.wait();

      AttnArgs la = aa;  // per thread: the shared template stays read-only
      la.layer = l;
      for (size_t g = g0; g < g1; ++g) {
        float* kr = qkv + qd + g * hd;
        float* vr = qkv + qd + kvd + g * hd;
        if (qwen3) rmsnorm(kr, kr, L.k_norm.data(), hd, eps);
        rope(kr, cs, cs + half, half);
        from_f32(kr, kv.dtype, kv.at(l, 0, g, pos), hd);
        from_f32(vr, kv.dtype, kv.at(l, 1, g, pos), hd);
        for (size_t hh = g * group; hh < (g + 1) * group; ++hh) {
          float* qr = qkv + hh * hd;
          if (qwen3) rmsnorm(qr, qr, L.q_norm.data(), hd, eps);
          rope(qr, cs, cs + half, half);
        }
        attention_group(la, g, as);
      }
      bar.wait();

      gemv_part(att, L.o, L.o_bias, x, true, o0, o1);
      bar.wait();

      rmsnorm(x, h, L.mlp_norm.data(), H, eps);
      if (fused_swiglu) {
        const size_t up = I / kPanelWidth;
        gemv_part(h, L.gate_up, L.gate_up_bias, gu, false, u0, u1);
        gemv_part(h, L.gate_up, L.gate_up_bias, gu, false, up + u0, up + u1);
        const size_t c0 = u0 * kPanelWidth, c1 = u1 * kPanelWidth;
        if (c1 > c0) swiglu(gu + c0, gu + I + c0, gu + c0, c1 - c0);
      } else {
        gemv_part(h, L.gate_up, L.gate_up_bias, gu, false, u0, u1);
        bar.wait();
        size_t c0, c1;
        split(I, T, t, &c0, &c1);
        if (c1 > c0) swiglu(gu + c0, gu + I + c0, gu + c0, c1 - c0);
      }
      bar.wait();

      gemv_part(gu, L.down, L.down_bias, x, true, d0, d1);
      bar.wait();
    }

    rmsnorm(x, h, w.final_norm.data(), H, eps);
    gemv_range(h, w.lm_head, logits, false, v0, v1);
  }
}

void decode_tuned(const ModelGeometry& m, const Weights& w, KvCache& kv, int32_t token, size_t pos, float* logits, Scratch& sc,
                  DecodeTuner& tu) {
  const int many = std::max(m.n_threads, 1);
  if (many == 1) {
    decode_step(m, w, kv, token, pos, logits, sc, 1);
    return;
  }
  constexpr uint32_t half = DecodeTuner::kProbe / 2;
  const bool probing = tu.step < DecodeTuner::kProbe;
  const int variant = probing ? static_cast<int>(tu.step % 2) : (tu.chosen == 1 ? 0 : 1);
  const auto t0 = std::chrono::steady_clock::now();
  decode_step(m, w, kv, token, pos, logits, sc, variant == 0 ? 1 : many);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (probing) {
    tu.probe_time[variant][tu.step / 2] = dt;
    if (tu.step + 1 == DecodeTuner::kProbe) {
      double med[2];
      for (int v = 0; v < 2; ++v) {
        double s[half];
        std::copy_n(tu.probe_time[v], half, s);
        std::sort(s, s + half);
        med[v] = s[half / 2];
      }
      tu.chosen = med[1] < med[0] ? many : 1;
    }
  }
  if (++tu.step >= DecodeTuner::kReprobeEvery) tu.step = 0;
}

}  // namespace kvr::cpu
