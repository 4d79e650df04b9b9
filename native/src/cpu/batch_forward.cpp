// CPU batched forward step (see batch_forward.h). Rows of all sequences are concatenated: row r
// belongs to sequence seq_of[r] at position pos_of[r]. Layer by layer the same math as
// forward.cpp (same kernels, same order per row), so a sequence's result differs from running
// it alone only by GEMM row blocking and attention split points (float summation order).
#include "cpu/batch_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <omp.h>

#include "common/device_math.h"
#include "cpu/attention.h"
#include "cpu/convert.h"
#include "cpu/decode_attention.h"
#include "cpu/gemm.h"
#include "cpu/ops.h"

namespace kvr::cpu {
namespace {

// Attention of this many multiply-adds or more gets every thread; smaller ones run one per
// thread side by side (a decode of a small model is far below it).
constexpr double kBigAttention = 1 << 20;

}  // namespace

void forward_batch(const ModelGeometry& m, const Weights& w, const BatchSeq* seqs, size_t count, BatchScratch& sc) {
  const size_t H = m.hidden, I = m.inter, hd = m.head_dim, half = hd / 2;
  const size_t qd = m.q_dim, kvd = m.kv_dim, ldqkv = qd + 2 * kvd;
  const int nt = m.n_threads;
  const float eps = m.params.rms_norm_eps;
  const bool qwen3 = m.params.arch == KVR_ARCH_QWEN3;

  size_t rows = 0, want = 0;
  for (size_t e = 0; e < count; ++e) {
    rows += seqs[e].n;
    want += seqs[e].logits != nullptr;
  }
  const bool par_rows = rows > 1 && rows * H >= 16384;

  // Attention plan: per sequence its args; big ones run alone with all threads, small ones as
  // a parallel loop with one thread each (each thread its own scratch slice).
  std::vector<AttnArgs> aa(count);
  std::vector<size_t> big, small;
  size_t big_floats = 0, small_floats = 0;
  std::vector<size_t> row0(count);
  {
    size_t r = 0;
    for (size_t e = 0; e < count; ++e) {
      row0[e] = r;
      r += seqs[e].n;
    }
  }

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

  for (size_t e = 0; e < count; ++e) {
    AttnArgs& a = aa[e];
    a.q = qkv + row0[e] * ldqkv;
    a.ldq = ldqkv;
    a.kv = seqs[e].kv;
    a.n = seqs[e].n;
    a.pos0 = seqs[e].pos0;
    a.heads = m.heads;
    a.kv_heads = m.kv_heads;
    a.head_dim = hd;
    a.out = att + row0[e] * qd;
    a.ldo = qd;
    const double work = 2.0 * m.heads * a.n * static_cast<double>(a.pos0 + a.n) * hd;
    if (nt > 1 && (work >= kBigAttention || count == 1)) {
      a.n_threads = nt;
      big.push_back(e);
      big_floats = std::max(big_floats, attention_scratch_floats(a));
    } else {
      a.n_threads = 1;
      small.push_back(e);
      // A decode (one row) scores its whole context in one pass (decode_attention.h).
      small_floats = std::max(small_floats, a.n == 1 ? decode_attention_scratch_floats(a) : attention_scratch_floats(a));
    }
  }
  const int small_threads = small.size() > 1 ? std::min<int>(nt, static_cast<int>(small.size())) : 1;
  small_floats = (small_floats + 15) & ~size_t{15};
  const size_t attn_need = std::max(big_floats, small_floats * static_cast<size_t>(small_threads));
  if (sc.attn.size() < attn_need) sc.attn.resize(attn_need);

#pragma omp parallel for num_threads(nt) schedule(static) if (par_rows)
  for (size_t r = 0; r < rows; ++r) {
    const BatchSeq& s = seqs[seq_of[r]];
    embed_row(w, static_cast<size_t>(s.tokens[pos_of[r] - s.pos0]), H, x + r * H);
    for (size_t d = 0; d < half; ++d)  // the same bits as forward.cpp (common/device_math.h)
      dm::rope_cos_sin(static_cast<uint32_t>(pos_of[r]), m.inv_freq[d], &cs[r * hd + d], &cs[r * hd + half + d]);
  }

  for (size_t l = 0; l < m.layers; ++l) {
    const LayerWeights& L = w.layer[l];
#pragma omp parallel for num_threads(nt) schedule(static) if (par_rows)
    for (size_t r = 0; r < rows; ++r) rmsnorm(x + r * H, h + r * H, L.attn_norm.data(), H, eps);
    matmul_xwt(h, rows, H, L.qkv, qkv, ldqkv, false, nt);

#pragma omp parallel for num_threads(nt) schedule(static) if (par_rows)
    for (size_t r = 0; r < rows; ++r) {
      float* row = qkv + r * ldqkv;
      if (!L.qkv_bias.empty()) add_inplace(row, L.qkv_bias.data(), ldqkv);
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

    for (size_t e : big) {
      aa[e].layer = l;
      attention(aa[e], sc.attn.data());
    }
    if (!small.empty()) {
      float* base = sc.attn.data();
#pragma omp parallel for num_threads(small_threads) schedule(dynamic, 1) if (small_threads > 1)
      for (size_t i = 0; i < small.size(); ++i) {
        AttnArgs a = aa[small[i]];
        a.layer = l;
        float* scratch = base + static_cast<size_t>(omp_get_thread_num()) * small_floats;
        if (a.n == 1) {
          decode_attention(a, scratch);
        } else {
          attention(a, scratch);
        }
      }
    }

    matmul_xwt(att, rows, qd, L.o, x, H, true, nt);
    if (!L.o_bias.empty())
      for (size_t r = 0; r < rows; ++r) add_inplace(x + r * H, L.o_bias.data(), H);

#pragma omp parallel for num_threads(nt) schedule(static) if (par_rows)
    for (size_t r = 0; r < rows; ++r) rmsnorm(x + r * H, h + r * H, L.mlp_norm.data(), H, eps);
    matmul_xwt(h, rows, H, L.gate_up, gu, 2 * I, false, nt);
#pragma omp parallel for num_threads(nt) schedule(static) if (par_rows)
    for (size_t r = 0; r < rows; ++r) {
      float* row = gu + r * 2 * I;
      if (!L.gate_up_bias.empty()) add_inplace(row, L.gate_up_bias.data(), 2 * I);
      swiglu(row, row + I, row, I);
    }
    matmul_xwt(gu, rows, 2 * I, L.down, x, H, true, nt);
    if (!L.down_bias.empty())
      for (size_t r = 0; r < rows; ++r) add_inplace(x + r * H, L.down_bias.data(), H);
  }

  if (want == 0) return;
  // Final norm of each wanting sequence's last row, compacted; then the lm_head GEMM straight
  // into the callers' rows, one GEMM per run of rows that follow each other in memory (batch.cpp
  // lays out returned rows and rows to sample as two such runs).
  size_t k = 0;
  for (size_t e = 0; e < count; ++e) {
    if (!seqs[e].logits) continue;
    rmsnorm(x + (row0[e] + seqs[e].n - 1) * H, h + k * H, w.final_norm.data(), H, eps);
    ++k;
  }
  size_t run0 = 0, len = 0;  // the run: compacted rows [run0, run0 + len) go to `dst`
  float* dst = nullptr;
  k = 0;
  for (size_t e = 0; e <= count; ++e) {
    if (e < count && !seqs[e].logits) continue;
    if (e < count && dst && seqs[e].logits == dst + len * m.vocab) {
      ++len;
    } else {
      if (len > 0) matmul_xwt(h + run0 * H, len, H, w.lm_head, dst, m.vocab, false, nt);
      if (e == count) break;
      run0 = k;
      len = 1;
      dst = seqs[e].logits;
    }
    ++k;
  }
}

}  // namespace kvr::cpu
