// Decode step (see decode_step.h). Every thread runs the whole layer loop and takes units of work
// from per-stage counters (dynamic claiming): a unit is a chunk of weight panels of a GEMV, or one
// GQA group's QKV columns + q/k norm + RoPE + KV write + attention. A thread waits only for the
// stage's units to be *finished*, not for every thread to arrive, so a thread the OS takes off its
// core for a while holds up at most the unit it is in (the partner takes the rest). Which thread
// computes a unit never changes its bits (each output column and each attention row is summed by
// one thread in a fixed order), so results equal the 1-thread step. RMSNorm of the one row is
// recomputed by each thread into its own buffer, once per stage it takes a unit in.
#include "cpu/decode_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <unordered_map>

#include "common/device_math.h"
#include "cpu/attention.h"
#include "cpu/decode_attention.h"
#include "cpu/ops.h"
#include "cpu/stage_units.h"
#include "host/convert.h"
#include "host/gemm.h"
#include "host/worker_pool.h"

namespace kvr::cpu {
namespace {

// Panels [p0, p1) of w for y (+)= x · Wᵀ, then the bias on the same columns.
void gemv_part(const float* x, const PackedWeight& w, const std::vector<float>& bias, float* y,
               bool accumulate, size_t p0, size_t p1) {
  gemv_range(x, w, y, accumulate, p0, p1);
  if (bias.empty() || p0 >= p1) return;
  const size_t c0 = p0 * kPanelWidth, c1 = std::min(p1 * kPanelWidth, w.rows());
  add_inplace(y + c0, bias.data() + c0, c1 - c0);
}

// The last tuner choice per model (keyed by Weights::uid). choice != 0 stores (a fresh probe);
// choice == 0 looks up for a new sequence: returns the stored choice, or 0 — probe — when none is
// stored or kReprobeSequences sequences have started from it since its probe (one unlucky probe,
// e.g. a stalled step on a busy machine, would otherwise decide every later short sequence of the
// model: measured, q4 tiny-balanced ran 1 thread at 0.95x the 1-thread mean where forced 2
// threads gave 1.13x).
int shared_choice(uint64_t model, int choice) {
  constexpr uint32_t kReprobeSequences = 4;
  struct Entry {
    int choice;
    uint32_t uses;
  };
  static std::mutex mu;
  static std::unordered_map<uint64_t, Entry> last;
  std::lock_guard<std::mutex> lock(mu);
  if (choice != 0) {
    if (last.size() > 64) last.clear();  // bounded: models come and go
    last[model] = {choice, 0};
    return choice;
  }
  const auto it = last.find(model);
  if (it == last.end() || ++it->second.uses > kReprobeSequences) return 0;
  return it->second.choice;
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
  const size_t pw = kPanelWidth;

  AttnArgs aa;
  aa.ldq = ldqkv;
  aa.kv = &kv;
  aa.n = 1;
  aa.pos0 = pos;
  aa.heads = m.heads;
  aa.kv_heads = m.kv_heads;
  aa.head_dim = hd;
  aa.ldo = qd;
  auto r16 = [](size_t n) { return (n + 15) & ~size_t{15}; };
  // Per thread: the fused path's whole-group scratch, or the split path's block buffer, its own
  // roped copy of a group's query heads and its own combined attention row.
  const size_t attn_each = r16(std::max(decode_attention_scratch_floats(aa),
                                        decode_block_scratch_floats(aa) + r16(group * hd) + r16(qd)));
  const size_t parts_each = r16(decode_parts_floats(aa));  // split path: per group, shared
  const size_t h_each = (H + 15) & ~size_t{15};
  const size_t need = H + ldqkv + qd + 2 * I + hd + nt * h_each;
  if (sc.main.size() < need) sc.main.resize(need);
  if (sc.attn.size() < nt * attn_each + m.kv_heads * parts_each) sc.attn.resize(nt * attn_each + m.kv_heads * parts_each);
  float* x = sc.main.data();  // (H) residual stream, shared
  float* qkv = x + H;         // (q_dim + 2 kv_dim), shared
  float* att = qkv + ldqkv;   // (q_dim), shared
  float* gu = att + qd;       // (2I): [gate | up], SwiGLU written into the gate half
  float* cs = gu + 2 * I;     // (hd): cos (half) then sin (half)
  float* hbase = cs + hd;     // (nt, H): each thread's normed copy of x
  aa.q = qkv;
  aa.out = att;

  // Attention stages. Fused (head_dim a multiple of 16, so a head's columns are whole panels, and
  // enough GQA groups to go round): one unit per group — its q/k/v columns of the QKV projection,
  // k-norm, RoPE, KV write, q-norm, RoPE and the group's attention (cpu/decode_attention.h),
  // nothing read from another unit. Else three stages: QKV panel chunks; scores per (group, block
  // of kDecodeBlock positions) — the unit of a group's last block first writes the group's K/V at
  // pos; values per (group, block); each thread then adds the blocks' partials itself (in block
  // order) before its first O-projection unit. decode_attention_group computes the same phases in
  // the same order, so the bits do not depend on the split. Groups, not query heads, are the unit:
  // per head, tiny-balanced's 3 heads over 2 threads run 2:1 and each head re-reads its group's
  // K/V (attention 102 µs of thread time at 512 positions against 67 µs per group).
  const bool fused_attn = hd % pw == 0 && (m.kv_heads % nt == 0 || m.kv_heads >= 2 * nt);
  // gate and up panels line up when I is a multiple of the panel width: a unit of gate panels
  // [a, b) also computes up panels [I/16 + a, I/16 + b) and applies SwiGLU there.
  const bool fused_swiglu = I % pw == 0;
  const size_t per_layer = (fused_attn ? 4 : 6) + (fused_swiglu ? 0 : 1);
  const size_t n_stages = m.layers * per_layer + 1;
  if (sc.stage_count < n_stages) {
    sc.stages.reset(new StageCounter[n_stages]);
    sc.stage_count = n_stages;
  }
  for (size_t i = 0; i < n_stages; ++i) {  // published to the workers by the pool's region start
    sc.stages[i].done.v.store(0, std::memory_order_relaxed);
    for (auto& c : sc.stages[i].next) c.v.store(0, std::memory_order_relaxed);
  }
  std::atomic<uint32_t> sleepers{0};

  embed_row(w, static_cast<size_t>(token), H, x);
  // The same bits as the batched layer loop and the CUDA backend (common/device_math.h).
  for (size_t d = 0; d < half; ++d)
    dm::rope_cos_sin(static_cast<uint32_t>(pos), m.inv_freq[d], &cs[d], &cs[half + d]);

  // Panel chunks: about 2 units per thread per GEMV (each claim and completion is an atomic on a
  // line both cores write, ~0.1–0.2 µs; more, smaller units would balance better), at least 2
  // panels.
  auto chunk_of = [&](size_t panels) { return std::max<size_t>(2, panels / (2 * nt)); };
  const size_t qkv_panels = w.layer.empty() ? 0 : w.layer[0].qkv.panels();
  const size_t o_panels = w.layer.empty() ? 0 : w.layer[0].o.panels();
  const size_t down_panels = w.layer.empty() ? 0 : w.layer[0].down.panels();
  const size_t gu_panels = fused_swiglu ? I / pw : (w.layer.empty() ? 0 : w.layer[0].gate_up.panels());
  const size_t qkv_chunk = chunk_of(qkv_panels), o_chunk = chunk_of(o_panels);
  const size_t down_chunk = chunk_of(down_panels), gu_chunk = chunk_of(gu_panels);
  const size_t head_chunk = std::max<size_t>(8, w.lm_head.panels() / (4 * nt));
  auto units = [](size_t count, size_t chunk) { return static_cast<uint32_t>((count + chunk - 1) / chunk); };
  const size_t swiglu_chunk = 256;
  const size_t nb = decode_blocks(aa);
  const uint32_t attn_units = static_cast<uint32_t>(m.kv_heads * nb);
  float* parts_base = sc.attn.data() + nt * attn_each;

  auto body = [&](unsigned team_thread, unsigned team) {
    const size_t t = team_thread;
    float* h = hbase + t * h_each;
    float* as = sc.attn.data() + t * attn_each;
    float* qloc = as + decode_block_scratch_floats(aa);  // split path: this thread's roped q
    float* attl = qloc + r16(group * hd);                  // split path: this thread's attention row
    StageCounter* st = sc.stages.get();
    // Each stage: this thread's claims, then a wait for all its units (cpu/stage_units.h).
    auto stage = [&](StageCounter& s, uint32_t total, auto&& unit) {
      run_stage(s, total, team_thread, team, sleepers, unit);
    };

    for (size_t l = 0; l < m.layers; ++l) {
      const LayerWeights& L = w.layer[l];
      AttnArgs la = aa;  // per thread: the shared template stays read-only
      la.layer = l;
      bool normed = false;
      auto norm_once = [&](const std::vector<float>& weight) {
        if (!normed) rmsnorm(x, h, weight.data(), H, eps);
        normed = true;
      };
      auto kv_write = [&](size_t g) {
        float* kr = qkv + qd + g * hd;
        if (qwen3) rmsnorm(kr, kr, L.k_norm.data(), hd, eps);
        rope(kr, cs, cs + half, half);
        from_f32(kr, kv.dtype, kv.at(l, 0, g, pos), hd);
        from_f32(qkv + qd + kvd + g * hd, kv.dtype, kv.at(l, 1, g, pos), hd);
      };
      auto q_prep = [&](float* qr) {  // one query head in place: Qwen3 q-norm, RoPE
        if (qwen3) rmsnorm(qr, qr, L.q_norm.data(), hd, eps);
        rope(qr, cs, cs + half, half);
      };
      if (fused_attn) {
        stage(*st++, static_cast<uint32_t>(m.kv_heads), [&](uint32_t g) {
          norm_once(L.attn_norm);
          gemv_part(h, L.qkv, L.qkv_bias, qkv, false, g * group * hd / pw, (g + 1) * group * hd / pw);
          gemv_part(h, L.qkv, L.qkv_bias, qkv, false, (qd + g * hd) / pw, (qd + (g + 1) * hd) / pw);
          gemv_part(h, L.qkv, L.qkv_bias, qkv, false, (qd + kvd + g * hd) / pw,
                    (qd + kvd + (g + 1) * hd) / pw);
          kv_write(g);
          for (size_t hh = g * group; hh < (g + 1) * group; ++hh) q_prep(qkv + hh * hd);
          decode_attention_group(la, g, as);
        });
      } else {
        stage(*st++, units(qkv_panels, qkv_chunk), [&](uint32_t u) {
          norm_once(L.attn_norm);
          gemv_part(h, L.qkv, L.qkv_bias, qkv, false, u * qkv_chunk, std::min(qkv_panels, (u + 1) * qkv_chunk));
        });
        stage(*st++, attn_units, [&](uint32_t u) {
          const size_t g = u / nb, b = u % nb;
          if (b == nb - 1) kv_write(g);  // the block holding pos
          std::copy(qkv + g * group * hd, qkv + (g + 1) * group * hd, qloc);
          for (size_t r = 0; r < group; ++r) q_prep(qloc + r * hd);  // on this thread's copy
          decode_scores_block(la, g, qloc, b, decode_parts(la, parts_base + g * parts_each), as);
        });
        stage(*st++, attn_units, [&](uint32_t u) {
          const size_t g = u / nb;
          decode_values_block(la, g, u % nb, decode_parts(la, parts_base + g * parts_each), as);
        });
      }

      bool combined = fused_attn;
      stage(*st++, units(o_panels, o_chunk), [&](uint32_t u) {
        if (!combined) {
          for (size_t g = 0; g < m.kv_heads; ++g)
            decode_combine(la, g, decode_parts(la, parts_base + g * parts_each), attl + g * group * hd);
          combined = true;
        }
        gemv_part(fused_attn ? att : attl, L.o, L.o_bias, x, true, u * o_chunk, std::min(o_panels, (u + 1) * o_chunk));
      });

      normed = false;
      if (fused_swiglu) {
        stage(*st++, units(gu_panels, gu_chunk), [&](uint32_t u) {
          norm_once(L.mlp_norm);
          const size_t p0 = u * gu_chunk, p1 = std::min(gu_panels, (u + 1) * gu_chunk);
          gemv_part(h, L.gate_up, L.gate_up_bias, gu, false, p0, p1);
          gemv_part(h, L.gate_up, L.gate_up_bias, gu, false, gu_panels + p0, gu_panels + p1);
          swiglu(gu + p0 * pw, gu + I + p0 * pw, gu + p0 * pw, (p1 - p0) * pw);
        });
      } else {
        stage(*st++, units(gu_panels, gu_chunk), [&](uint32_t u) {
          norm_once(L.mlp_norm);
          gemv_part(h, L.gate_up, L.gate_up_bias, gu, false, u * gu_chunk, std::min(gu_panels, (u + 1) * gu_chunk));
        });
        stage(*st++, units(I, swiglu_chunk), [&](uint32_t u) {
          const size_t c0 = u * swiglu_chunk, c1 = std::min(I, c0 + swiglu_chunk);
          swiglu(gu + c0, gu + I + c0, gu + c0, c1 - c0);
        });
      }

      stage(*st++, units(down_panels, down_chunk), [&](uint32_t u) {
        gemv_part(gu, L.down, L.down_bias, x, true, u * down_chunk, std::min(down_panels, (u + 1) * down_chunk));
      });
    }

    bool normed = false;
    const size_t vp = w.lm_head.panels();
    stage(*st++, units(vp, head_chunk), [&](uint32_t u) {
      if (!normed) rmsnorm(x, h, w.final_norm.data(), H, eps);
      normed = true;
      gemv_range(h, w.lm_head, logits, false, u * head_chunk, std::min(vp, (u + 1) * head_chunk));
    });
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
  if (tu.step == 0 && tu.chosen == 0) {
    // A new sequence starts from the model's last measured choice (a short generation would
    // otherwise spend most of its steps probing; every few sequences probe afresh, see
    // shared_choice) and probes again after kReprobeEvery steps.
    const int shared = shared_choice(w.uid, 0);
    if (shared != 0) {
      tu.chosen = shared;
      tu.step = DecodeTuner::kProbe;
    }
  }
  const bool probing = tu.step < DecodeTuner::kProbe;
  constexpr uint32_t kBlock = DecodeTuner::kBlock;
  const uint32_t block = tu.step / kBlock;
  const int variant = probing ? static_cast<int>(block % 2) : (tu.chosen == 1 ? 0 : 1);
  const auto t0 = std::chrono::steady_clock::now();
  const unsigned want = variant == 0 ? 1 : static_cast<unsigned>(many);
  const unsigned used = decode_step(m, w, kv, token, pos, logits, sc, static_cast<int>(want));
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // A step that ran alone because another sequence held the pool says nothing about the choice:
  // it is not counted, and the probe step is repeated.
  if (probing && used != want) return;
  if (probing) {
    tu.probe_time[variant][(block / 2) * kBlock + tu.step % kBlock] = dt;
    if (tu.step + 1 == DecodeTuner::kProbe) {
      double total[2] = {0, 0};  // the mean, not the median: stalls cost throughput
      for (int v = 0; v < 2; ++v)
        for (uint32_t i = 0; i < half; ++i)
          if (i % kBlock != 0) total[v] += tu.probe_time[v][i];  // a block's first step: warm-up
      tu.chosen = total[1] < total[0] ? many : 1;
      shared_choice(w.uid, tu.chosen);
    }
  }
  if (++tu.step >= DecodeTuner::kReprobeEvery) tu.step = 0;
}

}  // namespace kvr::cpu
