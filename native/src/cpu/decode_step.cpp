// Decode step (see decode_step.h). Every thread runs the whole layer loop; the GEMVs are split by
// weight panels (each thread owns a fixed column range of every projection), attention by KV
// head, and the small row ops are either fused into the owner's range (biases, SwiGLU) or
// recomputed by every thread into its own buffer (RMSNorm of one row: cheaper than a barrier).
// Four barriers per layer (after attention, O, gate/up+SwiGLU and down) when GQA groups divide
// evenly over the threads, five otherwise (also after QKV).
#include "cpu/decode_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/device_math.h"
#include "cpu/attention.h"
#include "cpu/convert.h"
#include "cpu/gemm.h"
#include "cpu/ops.h"
#include "cpu/spin_barrier.h"
#include "cpu/worker_pool.h"

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

unsigned decode_step(const ModelGeometry& m, const Weights& w, KvCache& kv, int32_t token, size_t pos, float* logits,
                     Scratch& sc, int n_threads) {
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

  // Attention is split by query head: thread t owns a contiguous head range (whole GQA groups when
  // they divide evenly, else near-equal ranges that may cut a group), computes those heads' q
  // columns of the QKV projection itself, and the k/v columns, k-norm, RoPE and cache write of every
  // group whose first head it owns. When every group lies within one thread, no thread reads what
  // another wrote before attention and the QKV barrier is skipped. Needs head_dim % 16 == 0 (heads
  // map to whole weight panels) and groups below the attention kernel's 8-row block path (a subset
  // of a group then runs the same per-row kernel as the whole group).
  const bool by_head = hd % kPanelWidth == 0 && group < 8;
  auto head_range = [&](size_t T, size_t t, size_t* h0, size_t* h1) {
    if (m.kv_heads % T == 0 || !by_head) {
      size_t g0, g1;
      split(m.kv_heads, T, t, &g0, &g1);
      *h0 = g0 * group;
      *h1 = g1 * group;
    } else {
      split(m.heads, T, t, h0, h1);
    }
  };

  auto body = [&](unsigned team_thread, unsigned team) {
    const size_t T = team;
    const size_t t = team_thread;
    bar.arm(team);
    float* h = hbase + t * h_each;
    float* as = sc.attn.data() + t * attn_each;
    size_t q0, q1, o0, o1, d0, d1, v0, v1;
    split(w.layer.empty() ? 0 : w.layer[0].qkv.panels(), T, t, &q0, &q1);
    split(w.layer.empty() ? 0 : w.layer[0].o.panels(), T, t, &o0, &o1);
    split(w.layer.empty() ? 0 : w.layer[0].down.panels(), T, t, &d0, &d1);
    split(w.lm_head.panels(), T, t, &v0, &v1);
    size_t u0, u1;  // gate/up panels (fused: gate panel range; else all panels)
    split(fused_swiglu ? I / kPanelWidth : (w.layer.empty() ? 0 : w.layer[0].gate_up.panels()), T, t,
          &u0, &u1);
    size_t h0, h1;  // attention heads of this thread
    head_range(T, t, &h0, &h1);
    const size_t og0 = (h0 + group - 1) / group, og1 = (h1 + group - 1) / group;  // k/v groups
    bool aligned = true;  // every group's heads on one thread: no QKV barrier
    for (size_t u = 0; u < T; ++u) {
      size_t a0, a1;
      head_range(T, u, &a0, &a1);
      aligned = aligned && a0 % group == 0 && a1 % group == 0;
    }
    const size_t pw = kPanelWidth;

    for (size_t l = 0; l < m.layers; ++l) {
      const LayerWeights& L = w.layer[l];
      rmsnorm(x, h, L.attn_norm.data(), H, eps);
      if (!by_head) {
        gemv_part(h, L.qkv, L.qkv_bias, qkv, false, q0, q1);
        bar.wait();
      } else {
        gemv_part(h, L.qkv, L.qkv_bias, qkv, false, h0 * hd / pw, h1 * hd / pw);
        gemv_part(h, L.qkv, L.qkv_bias, qkv, false, (qd + og0 * hd) / pw, (qd + og1 * hd) / pw);
        gemv_part(h, L.qkv, L.qkv_bias, qkv, false, (qd + kvd + og0 * hd) / pw,
                  (qd + kvd + og1 * hd) / pw);
        for (size_t g = og0; g < og1; ++g) {
          float* kr = qkv + qd + g * hd;
          if (qwen3) rmsnorm(kr, kr, L.k_norm.data(), hd, eps);
          rope(kr, cs, cs + half, half);
          from_f32(kr, kv.dtype, kv.at(l, 0, g, pos), hd);
          from_f32(qkv + qd + kvd + g * hd, kv.dtype, kv.at(l, 1, g, pos), hd);
        }
        if (!aligned) bar.wait();  // a group's keys are written by another thread
      }

      AttnArgs la = aa;  // per thread: the shared template stays read-only
      la.layer = l;
      if (!by_head) {
        size_t g0, g1;
        split(m.kv_heads, T, t, &g0, &g1);
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
      } else {
        for (size_t hh = h0; hh < h1; ++hh) {
          float* qr = qkv + hh * hd;
          if (qwen3) rmsnorm(qr, qr, L.q_norm.data(), hd, eps);
          rope(qr, cs, cs + half, half);
        }
        for (size_t g = h0 / group; g * group < h1; ++g) {
          const size_t r0 = std::max(h0, g * group) - g * group;
          const size_t r1 = std::min(h1, (g + 1) * group) - g * group;
          if (r1 <= r0) continue;
          if (r0 == 0 && r1 == group) {
            attention_group(la, g, as);
            continue;
          }
          // Rows [r0, r1) of group g as a group of r1 − r0 heads: attention_group reads query
          // (and writes output) head g·s + i, so shift q and out to land on head g·group + r0 + i.
          const size_t sub = r1 - r0, shift = (g * (group - sub) + r0) * hd;
          AttnArgs sa = la;
          sa.heads = m.kv_heads * sub;
          sa.q = qkv + shift;
          sa.out = att + shift;
          attention_group(sa, g, as);
        }
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
  };
  using Body = decltype(body);
  return WorkerPool::shared().run(
      static_cast<unsigned>(nt),
      [](void* ctx, unsigned t, unsigned team) { (*static_cast<Body*>(ctx))(t, team); }, &body);
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
  const unsigned want = variant == 0 ? 1 : static_cast<unsigned>(many);
  const unsigned used = decode_step(m, w, kv, token, pos, logits, sc, static_cast<int>(want));
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // A step that ran alone because another sequence held the pool says nothing about the choice:
  // it is not counted, and the probe step is repeated.
  if (probing && used != want) return;
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
