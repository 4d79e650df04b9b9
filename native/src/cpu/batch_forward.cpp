// CPU batched forward step (see batch_forward.h). Rows of all sequences are concatenated: row r
// belongs to sequence seq_of[r] at position pos_of[r]. Layer by layer the same math as
// forward.cpp (same kernels, same order per row), so a sequence's result differs from running
// it alone only by GEMM row blocking and attention split points (float summation order).
//
// Threads: the whole step is ONE region on the persistent WorkerPool (cpu/worker_pool.h), every
// thread running the layer loop with a barrier between stages. Not OpenMP: Deno calls the step
// from whichever thread of its blocking pool is free and libgomp keeps one team per calling
// thread, so the second core gave the step nothing (measured: 1 vs 2 threads 1.27 vs 1.34 ms for
// a 32-row tiny-fast step inside Deno; a C harness got 1.7–2.0×). Splits: GEMMs by weight panels
// (static: each thread the same panels every step, so its share of the weights stays in its
// core's cache), row ops by rows (static), attention by units — a decode row, or a block of a
// prefill chunk's rows — claimed from a counter (contexts differ in length).
#include "cpu/batch_forward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>

#include "common/device_math.h"
#include "cpu/attention.h"
#include "cpu/convert.h"
#include "cpu/decode_attention.h"
#include "cpu/gemm.h"
#include "cpu/ops.h"
#include "cpu/team_barrier.h"
#include "cpu/worker_pool.h"

namespace kvr::cpu {
namespace {

// Query rows of a prefill chunk per attention unit: enough units for the threads to balance a
// long chunk (row i's cost grows with its position), few enough that claiming stays negligible.
constexpr size_t kAttnRows = 16;

// [*b, *e) = part i of [0, count) cut into `parts` near-equal contiguous ranges.
void split(size_t count, unsigned parts, unsigned i, size_t* b, size_t* e) {
  const size_t base = count / parts, extra = count % parts;
  *b = i * base + std::min<size_t>(i, extra);
  *e = *b + base + (i < extra ? 1 : 0);
}

// Rows [r0, r1) of sequence `seq`'s new tokens: one unit of attention work.
struct AttnUnit {
  size_t seq, r0, r1;
};

// One run of compacted final-norm rows [row0, row0 + len) whose logits go to dst (contiguous).
struct HeadRun {
  size_t row0, len;
  float* dst;
};

}  // namespace

void forward_batch(const ModelGeometry& m, const Weights& w, const BatchSeq* seqs, size_t count, BatchScratch& sc) {
  const size_t H = m.hidden, I = m.inter, hd = m.head_dim, half = hd / 2;
  const size_t qd = m.q_dim, kvd = m.kv_dim, ldqkv = qd + 2 * kvd;
  const unsigned nt = static_cast<unsigned>(std::max(m.n_threads, 1));
  const float eps = m.params.rms_norm_eps;
  const bool qwen3 = m.params.arch == KVR_ARCH_QWEN3;
  const size_t pw = kPanelWidth;
  // gate and up panels line up when I is a multiple of the panel width: a thread's gate panels
  // [a, b) and up panels [I/16 + a, I/16 + b) give it whole SwiGLU columns (no extra stage).
  const bool fused_swiglu = I % pw == 0;

  size_t rows = 0;
  std::vector<size_t> row0(count);
  for (size_t e = 0; e < count; ++e) {
    row0[e] = rows;
    rows += seqs[e].n;
  }
  if (rows == 0) return;

  const size_t need = rows * (2 * H + ldqkv + qd + 2 * I + hd);
  if (sc.main.size() < need) sc.main.resize(need);
  float* x = sc.main.data();        // (rows, H) residual stream
  float* h = x + rows * H;          // (rows, H) normed
  float* qkv = h + rows * H;        // (rows, q_dim + 2 kv_dim)
  float* att = qkv + rows * ldqkv;  // (rows, q_dim)
  float* gu = att + rows * qd;      // (rows, 2I)
  float* cs = gu + rows * 2 * I;    // (rows, hd): cos (half) then sin (half)
  std::vector<size_t> seq_of(rows), pos_of(rows);
  for (size_t e = 0; e < count; ++e)
    for (size_t i = 0; i < seqs[e].n; ++i) {
      seq_of[row0[e] + i] = e;
      pos_of[row0[e] + i] = seqs[e].pos0 + i;
    }

  // Attention units: prefill chunks' row blocks first (the longest work, so the claims end
  // balanced), then the decodes. Each unit runs on one thread with its own scratch slice.
  AttnArgs base;
  base.ldq = ldqkv;
  base.heads = m.heads;
  base.kv_heads = m.kv_heads;
  base.head_dim = hd;
  base.ldo = qd;
  base.n_threads = 1;
  auto unit_args = [&](const AttnUnit& u) {
    AttnArgs a = base;
    const BatchSeq& s = seqs[u.seq];
    a.kv = s.kv;
    a.q = qkv + (row0[u.seq] + u.r0) * ldqkv;
    a.out = att + (row0[u.seq] + u.r0) * qd;
    a.n = u.r1 - u.r0;
    a.pos0 = s.pos0 + u.r0;
    return a;
  };
  std::vector<AttnUnit> units;
  size_t attn_floats = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t e = 0; e < count; ++e) {
      const size_t n = seqs[e].n;
      if ((n > 1) != (pass == 0) || n == 0) continue;
      for (size_t r = 0; r < n; r += kAttnRows) {
        units.push_back({e, r, std::min(n, r + kAttnRows)});
        const AttnArgs a = unit_args(units.back());
        // A decode scores its whole context in one pass (decode_attention.h).
        attn_floats = std::max(attn_floats, a.n == 1 ? decode_attention_scratch_floats(a) : attention_scratch_floats(a));
      }
    }
  attn_floats = (attn_floats + 15) & ~size_t{15};
  if (sc.attn.size() < attn_floats * nt) sc.attn.resize(attn_floats * nt);

  // lm_head plan: each wanting sequence's last row, normed into compacted rows of h, then one
  // GEMM per run of rows whose destinations follow each other in memory (batch.cpp lays out
  // returned rows and rows to sample as two such runs) — straight into the callers' rows.
  std::vector<size_t> want_rows;  // source row of compacted row k
  std::vector<HeadRun> runs;
  for (size_t e = 0; e < count; ++e) {
    if (!seqs[e].logits) continue;
    const size_t k = want_rows.size();
    want_rows.push_back(row0[e] + seqs[e].n - 1);
    if (!runs.empty() && runs.back().dst + runs.back().len * m.vocab == seqs[e].logits) {
      ++runs.back().len;
    } else {
      runs.push_back({k, 1, seqs[e].logits});
    }
  }

  std::unique_ptr<std::atomic<uint32_t>[]> next_unit(new std::atomic<uint32_t>[m.layers]);
  for (size_t l = 0; l < m.layers; ++l) next_unit[l].store(0, std::memory_order_relaxed);
  TeamBarrier barrier;
  std::atomic<bool> failed{false};

  auto body = [&](unsigned t, unsigned T) {
    size_t rb, re;  // this thread's rows
    split(rows, T, t, &rb, &re);
    // y (+)= a · Wᵀ (+ bias) on this thread's panels of W. A failure (only std::bad_alloc of a
    // first call's packing scratch) is carried out by hand: the thread keeps meeting the
    // barriers so the others finish, and the step throws after the region.
    auto gemm = [&](const float* a, size_t lda, const PackedWeight& W, const std::vector<float>& bias, float* y,
                    size_t ldy, bool acc, size_t p0, size_t p1) {
      try {
        gemm_range(a, rows, lda, W, y, ldy, acc, p0, p1);
      } catch (...) {
        failed.store(true, std::memory_order_relaxed);
        return;
      }
      if (bias.empty() || p0 >= p1) return;
      const size_t c0 = p0 * pw, c1 = std::min(p1 * pw, W.rows());
      for (size_t r = 0; r < rows; ++r) add_inplace(y + r * ldy + c0, bias.data() + c0, c1 - c0);
    };
    auto my_panels = [&](const PackedWeight& W, size_t* p0, size_t* p1) { split(W.panels(), T, t, p0, p1); };
    size_t p0, p1;

    for (size_t r = rb; r < re; ++r) {
      const BatchSeq& s = seqs[seq_of[r]];
      embed_row(w, static_cast<size_t>(s.tokens[pos_of[r] - s.pos0]), H, x + r * H);
      for (size_t d = 0; d < half; ++d)  // the same bits as forward.cpp (common/device_math.h)
        dm::rope_cos_sin(static_cast<uint32_t>(pos_of[r]), m.inv_freq[d], &cs[r * hd + d], &cs[r * hd + half + d]);
    }

    float* scratch = sc.attn.data() + t * attn_floats;
    for (size_t l = 0; l < m.layers; ++l) {
      const LayerWeights& L = w.layer[l];
      for (size_t r = rb; r < re; ++r) rmsnorm(x + r * H, h + r * H, L.attn_norm.data(), H, eps);
      barrier.wait(T);
      my_panels(L.qkv, &p0, &p1);
      gemm(h, H, L.qkv, L.qkv_bias, qkv, ldqkv, false, p0, p1);
      barrier.wait(T);

      for (size_t r = rb; r < re; ++r) {
        float* row = qkv + r * ldqkv;
        float* kr = row + qd;
        float* vr = row + qd + kvd;
        if (qwen3) {
          for (size_t hh = 0; hh < m.heads; ++hh) rmsnorm(row + hh * hd, row + hh * hd, L.q_norm.data(), hd, eps);
          for (size_t g = 0; g < m.kv_heads; ++g) rmsnorm(kr + g * hd, kr + g * hd, L.k_norm.data(), hd, eps);
        }
        const float* c = cs + r * hd;
        for (size_t hh = 0; hh < m.heads; ++hh) rope(row + hh * hd, c, c + half, half);
        KvCache& kv = *seqs[seq_of[r]].kv;
        for (size_t g = 0; g < m.kv_heads; ++g) {
          rope(kr + g * hd, c, c + half, half);
          from_f32(kr + g * hd, kv.dtype, kv.at(l, 0, g, pos_of[r]), hd);
          from_f32(vr + g * hd, kv.dtype, kv.at(l, 1, g, pos_of[r]), hd);
        }
      }
      barrier.wait(T);  // every row's keys are in its cache before any attention reads them

      for (size_t u = next_unit[l].fetch_add(1, std::memory_order_relaxed); u < units.size();
           u = next_unit[l].fetch_add(1, std::memory_order_relaxed)) {
        AttnArgs a = unit_args(units[u]);
        a.layer = l;
        if (a.n == 1) {
          decode_attention(a, scratch);
        } else {
          attention(a, scratch);
        }
      }
      barrier.wait(T);

      my_panels(L.o, &p0, &p1);
      gemm(att, qd, L.o, L.o_bias, x, H, true, p0, p1);
      barrier.wait(T);
      for (size_t r = rb; r < re; ++r) rmsnorm(x + r * H, h + r * H, L.mlp_norm.data(), H, eps);
      barrier.wait(T);

      if (fused_swiglu) {
        split(I / pw, T, t, &p0, &p1);
        gemm(h, H, L.gate_up, L.gate_up_bias, gu, 2 * I, false, p0, p1);
        gemm(h, H, L.gate_up, L.gate_up_bias, gu, 2 * I, false, I / pw + p0, I / pw + p1);
        for (size_t r = 0; r < rows && p1 > p0; ++r) {
          float* row = gu + r * 2 * I;
          swiglu(row + p0 * pw, row + I + p0 * pw, row + p0 * pw, (p1 - p0) * pw);
        }
      } else {
        my_panels(L.gate_up, &p0, &p1);
        gemm(h, H, L.gate_up, L.gate_up_bias, gu, 2 * I, false, p0, p1);
        barrier.wait(T);
        for (size_t r = rb; r < re; ++r) swiglu(gu + r * 2 * I, gu + r * 2 * I + I, gu + r * 2 * I, I);
      }
      barrier.wait(T);
      my_panels(L.down, &p0, &p1);
      gemm(gu, 2 * I, L.down, L.down_bias, x, H, true, p0, p1);
      barrier.wait(T);
    }

    if (want_rows.empty()) return;
    size_t kb, ke;
    split(want_rows.size(), T, t, &kb, &ke);
    for (size_t k = kb; k < ke; ++k) rmsnorm(x + want_rows[k] * H, h + k * H, w.final_norm.data(), H, eps);
    barrier.wait(T);
    my_panels(w.lm_head, &p0, &p1);
    for (const HeadRun& run : runs) {
      try {
        gemm_range(h + run.row0 * H, run.len, H, w.lm_head, run.dst, m.vocab, false, p0, p1);
      } catch (...) {
        failed.store(true, std::memory_order_relaxed);
      }
    }
  };
  using Body = decltype(body);
  WorkerPool::shared().run(nt, [](void* ctx, unsigned t, unsigned team) { (*static_cast<Body*>(ctx))(t, team); },
                           &body);
  if (failed.load(std::memory_order_relaxed)) throw std::bad_alloc();
}

}  // namespace kvr::cpu
