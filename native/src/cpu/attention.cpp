// Causal GQA attention over the KV cache (see attention.h). A work item is (kv head, block of up
// to 24 queries with all heads of its group); it runs flash-style over 64-key tiles converted to
// f32 once and reused by every row, keeping (max, sum, acc) per row, then normalises.
#include "cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>


#include "cpu/vec_math.h"
#include "host/convert.h"
#include "host/simd.h"
#include "kvrelay.h"

#if KVR_X86
#include <immintrin.h>
#endif

namespace kvr::cpu {
namespace {

constexpr size_t kTile = 64;         // keys per tile
constexpr size_t kQBlock = kAttnQueryBlock;  // queries per work item (attention.h); 6 | 24
constexpr size_t kBlockMinRows = 8;  // fewer rows (decode): per-row kernel, no K transpose

// Keys per tile: kTile for either storage. A tile of a paged cache with smaller blocks spans
// several blocks: the block kernel reads f32 keys in place 8 at a time; the per-row kernel
// (decode-sized items) and other dtypes gather it into the thread's tile buffers.
size_t tile_keys(const KvCache&) { return kTile; }

struct Plan {
  size_t group, qblock, nqb, splits, items, rows_max;
  size_t partial_per_item;  // floats: rows_max * (head_dim + 2)
  size_t thread_floats;     // floats per thread: K, V tiles, scores, K tile transposed, row arrays
};

Plan make_plan(const AttnArgs& a) {
  Plan p{};
  p.group = a.heads / a.kv_heads;
  p.qblock = std::min(kQBlock, a.n);
  p.nqb = (a.n + p.qblock - 1) / p.qblock;
  p.splits = 1;  // one key segment: the result does not depend on how callers split the work
  p.items = a.kv_heads * p.nqb;
  p.rows_max = p.qblock * p.group;
  p.partial_per_item = p.rows_max * (a.head_dim + 2);
  // K tile, V tile, K tile transposed, scores (rows_max, kTile), then row pointers and counts.
  p.thread_floats = kTile * (3 * a.head_dim + 1) + p.rows_max * kTile + 4 * p.rows_max;
  p.thread_floats = (p.thread_floats + 15) & ~size_t{15};
  return p;
}

// One row against one tile of c keys: online-softmax update of (m, l, acc).
// kt, vt: (c, hd) f32 rows; s: c floats of scratch.
void row_tile_generic(const float* q, const float* kt, const float* vt, size_t c, size_t hd, float scale, float* s,
                      float* m, float* l, float* acc) {
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < c; ++j) {
    const float* k = kt + j * hd;
    float d = 0.f;
    for (size_t t = 0; t < hd; ++t) d += q[t] * k[t];
    s[j] = d * scale;
    mx = std::max(mx, s[j]);
  }
  const float mnew = std::max(*m, mx);
  const float corr = std::exp(*m - mnew);  // 0 when *m = -inf
  float sum = 0.f;
  for (size_t j = 0; j < c; ++j) {
    s[j] = std::exp(s[j] - mnew);
    sum += s[j];
  }
  for (size_t t = 0; t < hd; ++t) acc[t] *= corr;
  for (size_t j = 0; j < c; ++j) {
    const float p = s[j];
    const float* v = vt + j * hd;
    for (size_t t = 0; t < hd; ++t) acc[t] += p * v[t];
  }
  *l = *l * corr + sum;
  *m = mnew;
}

#if KVR_X86
// Online-softmax step for one row of c scaled scores: s[j] ← exp(s[j] − mnew) with
// mnew = max(m_old, mx); returns Σ s[j] and sets *corr = exp(m_old − mnew) (0 when m_old = −inf),
// the factor the row's running sum and output accumulator are rescaled by.
KVR_TARGET_AVX2 float exp_scores_avx2(float* s, size_t c, float m_old, float mx, float* mnew,
                                      float* corr) {
  *mnew = std::max(m_old, mx);
  *corr = std::exp(m_old - *mnew);
  const __m256 mv = _mm256_set1_ps(*mnew);
  __m256 sv = _mm256_setzero_ps();
  size_t j = 0;
  for (; j + 8 <= c; j += 8) {
    const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    _mm256_storeu_ps(s + j, p);
    sv = _mm256_add_ps(sv, p);
  }
  float sum = hsum8(sv);
  for (; j < c; ++j) {
    s[j] = std::exp(s[j] - *mnew);
    sum += s[j];
  }
  return sum;
}

KVR_TARGET_AVX2 void row_tile_avx2(const float* q, const float* kt, const float* vt, size_t c, size_t hd, float scale,
                                   float* s, float* m, float* l, float* acc) {
  const size_t hd8 = hd & ~size_t{7};
  float mx = -std::numeric_limits<float>::infinity();
  size_t j = 0;
  const __m256 scv = _mm256_set1_ps(scale);
  __m256 mxv = _mm256_set1_ps(mx);
  for (; j + 8 <= c; j += 8) {  // 8 keys at once, reduced with a horizontal-add transpose
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
    for (size_t t = 0; t < hd8; t += 8) {
      const __m256 qv = _mm256_loadu_ps(q + t);
      for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kt + (j + i) * hd + t), a[i]);
    }
    const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    __m256 sum8 = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
    if (hd8 < hd) {
      alignas(32) float tail[8];
      for (int i = 0; i < 8; ++i) {
        float d = 0.f;
        for (size_t t = hd8; t < hd; ++t) d += q[t] * kt[(j + i) * hd + t];
        tail[i] = d;
      }
      sum8 = _mm256_add_ps(sum8, _mm256_load_ps(tail));
    }
    sum8 = _mm256_mul_ps(sum8, scv);
    _mm256_storeu_ps(s + j, sum8);
    mxv = _mm256_max_ps(mxv, sum8);
  }
  {
    alignas(32) float m8[8];
    _mm256_store_ps(m8, mxv);
    for (int i = 0; i < 8; ++i) mx = std::max(mx, m8[i]);
  }
  for (; j < c; ++j) {
    const float* k = kt + j * hd;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    size_t t = 0;
    for (; t + 16 <= hd8; t += 16) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + t), _mm256_loadu_ps(k + t), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + t + 8), _mm256_loadu_ps(k + t + 8), a1);
    }
    for (; t < hd8; t += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + t), _mm256_loadu_ps(k + t), a0);
    float d = hsum8(_mm256_add_ps(a0, a1));
    for (; t < hd; ++t) d += q[t] * k[t];
    s[j] = d * scale;
    mx = std::max(mx, s[j]);
  }
  float mnew, corr;
  const float sum = exp_scores_avx2(s, c, *m, mx, &mnew, &corr);
  const __m256 cv = _mm256_set1_ps(corr);
  size_t t = 0;
  for (; t + 32 <= hd8; t += 32) {
    __m256 o0 = _mm256_mul_ps(_mm256_loadu_ps(acc + t), cv);
    __m256 o1 = _mm256_mul_ps(_mm256_loadu_ps(acc + t + 8), cv);
    __m256 o2 = _mm256_mul_ps(_mm256_loadu_ps(acc + t + 16), cv);
    __m256 o3 = _mm256_mul_ps(_mm256_loadu_ps(acc + t + 24), cv);
    for (size_t jj = 0; jj < c; ++jj) {
      const __m256 p = _mm256_broadcast_ss(s + jj);
      const float* v = vt + jj * hd + t;
      o0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v), o0);
      o1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8), o1);
      o2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 16), o2);
      o3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 24), o3);
    }
    _mm256_storeu_ps(acc + t, o0);
    _mm256_storeu_ps(acc + t + 8, o1);
    _mm256_storeu_ps(acc + t + 16, o2);
    _mm256_storeu_ps(acc + t + 24, o3);
  }
  for (; t < hd8; t += 8) {
    __m256 o0 = _mm256_mul_ps(_mm256_loadu_ps(acc + t), cv);
    for (size_t jj = 0; jj < c; ++jj)
      o0 = _mm256_fmadd_ps(_mm256_broadcast_ss(s + jj), _mm256_loadu_ps(vt + jj * hd + t), o0);
    _mm256_storeu_ps(acc + t, o0);
  }
  for (; t < hd; ++t) {
    float o = acc[t] * corr;
    for (size_t jj = 0; jj < c; ++jj) o += s[jj] * vt[jj * hd + t];
    acc[t] = o;
  }
  *l = *l * corr + sum;
  *m = mnew;
}
// Block version for head_dim % 8 == 0: all R rows of an item against one tile at once, so every
// K/V load feeds 6 rows. kT: (hd, kTile) scratch; S: (R, kTile) scratch;
// cnt[r]: valid keys of row r in this tile (0..tl). acc (R, hd), m/l (R): online-softmax state.
template <int RB>
KVR_TARGET_AVX2 inline void scores_rows(const float* const* q, const float* kT, size_t hd, size_t tl16, float* S) {
  for (size_t j0 = 0; j0 < tl16; j0 += 16) {
    __m256 a[RB][2];
    for (int r = 0; r < RB; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (size_t d = 0; d < hd; ++d) {
      const __m256 k0 = _mm256_loadu_ps(kT + d * kTile + j0);
      const __m256 k1 = _mm256_loadu_ps(kT + d * kTile + j0 + 8);
      for (int r = 0; r < RB; ++r) {
        const __m256 qb = _mm256_broadcast_ss(q[r] + d);
        a[r][0] = _mm256_fmadd_ps(qb, k0, a[r][0]);
        a[r][1] = _mm256_fmadd_ps(qb, k1, a[r][1]);
      }
    }
    for (int r = 0; r < RB; ++r) {
      _mm256_storeu_ps(S + r * kTile + j0, a[r][0]);
      _mm256_storeu_ps(S + r * kTile + j0 + 8, a[r][1]);
    }
  }
}

// vg: one pointer per 8 keys (key j at vg[j / 8] + (j % 8) * hd), as block_tile_avx2's.
template <int RB>
KVR_TARGET_AVX2 inline void pv_rows(const float* P, const float* const* vg, size_t tl, size_t hd, float* acc) {
  size_t d0 = 0;
  for (; d0 + 16 <= hd; d0 += 16) {
    __m256 a[RB][2];
    for (int r = 0; r < RB; ++r) {
      a[r][0] = _mm256_loadu_ps(acc + r * hd + d0);
      a[r][1] = _mm256_loadu_ps(acc + r * hd + d0 + 8);
    }
    for (size_t j8 = 0; j8 < tl; j8 += 8) {
      const float* vb = vg[j8 / 8] + d0;
      for (size_t j = j8; j < std::min(tl, j8 + 8); ++j, vb += hd) {
        const __m256 v0 = _mm256_loadu_ps(vb);
        const __m256 v1 = _mm256_loadu_ps(vb + 8);
        for (int r = 0; r < RB; ++r) {
          const __m256 pb = _mm256_broadcast_ss(P + r * kTile + j);
          a[r][0] = _mm256_fmadd_ps(pb, v0, a[r][0]);
          a[r][1] = _mm256_fmadd_ps(pb, v1, a[r][1]);
        }
      }
    }
    for (int r = 0; r < RB; ++r) {
      _mm256_storeu_ps(acc + r * hd + d0, a[r][0]);
      _mm256_storeu_ps(acc + r * hd + d0 + 8, a[r][1]);
    }
  }
  for (; d0 < hd; d0 += 8) {
    __m256 a[RB];
    for (int r = 0; r < RB; ++r) a[r] = _mm256_loadu_ps(acc + r * hd + d0);
    for (size_t j = 0; j < tl; ++j) {
      const __m256 v0 = _mm256_loadu_ps(vg[j / 8] + (j % 8) * hd + d0);
      for (int r = 0; r < RB; ++r) a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + r * kTile + j), v0, a[r]);
    }
    for (int r = 0; r < RB; ++r) _mm256_storeu_ps(acc + r * hd + d0, a[r]);
  }
}

// kg, vg: the tile's keys and values by 8 (key j at kg[j / 8] + (j % 8) * hd): read in place from
// the blocks of a paged cache, where a gathered copy of each tile cost a twelfth of a chunk's
// batched step (perf: memmove 7.9 % of a 240-token tiny-powerful chunk with 16 decodes).
KVR_TARGET_AVX2 void block_tile_avx2(const float* const* q, const size_t* cnt, size_t R, const float* const* kg,
                                     const float* const* vg, size_t tl, size_t hd, float scale, float* kT, float* S,
                                     float* m, float* l, float* acc) {
  const size_t tl16 = (tl + 15) & ~size_t{15};
  // K tile transposed to (hd, kTile) in 8x8 blocks; padding columns zeroed.
  size_t j8 = 0;
  for (; j8 + 8 <= tl; j8 += 8) {
    for (size_t d = 0; d < hd; d += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(kg[j8 / 8] + i * hd + d);
      const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
      const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
      const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float* o = kT + d * kTile + j8;
      _mm256_storeu_ps(o + 0 * kTile, _mm256_permute2f128_ps(u0, u4, 0x20));
      _mm256_storeu_ps(o + 1 * kTile, _mm256_permute2f128_ps(u1, u5, 0x20));
      _mm256_storeu_ps(o + 2 * kTile, _mm256_permute2f128_ps(u2, u6, 0x20));
      _mm256_storeu_ps(o + 3 * kTile, _mm256_permute2f128_ps(u3, u7, 0x20));
      _mm256_storeu_ps(o + 4 * kTile, _mm256_permute2f128_ps(u0, u4, 0x31));
      _mm256_storeu_ps(o + 5 * kTile, _mm256_permute2f128_ps(u1, u5, 0x31));
      _mm256_storeu_ps(o + 6 * kTile, _mm256_permute2f128_ps(u2, u6, 0x31));
      _mm256_storeu_ps(o + 7 * kTile, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
  }
  for (size_t j = j8; j < tl; ++j)
    for (size_t d = 0; d < hd; ++d) kT[d * kTile + j] = kg[j / 8][(j % 8) * hd + d];
  if (tl < tl16)
    for (size_t d = 0; d < hd; ++d)
      for (size_t j = tl; j < tl16; ++j) kT[d * kTile + j] = 0.f;
  size_t r = 0;
  for (; r + 6 <= R; r += 6) scores_rows<6>(q + r, kT, hd, tl16, S + r * kTile);
  for (; r < R; ++r) scores_rows<1>(q + r, kT, hd, tl16, S + r * kTile);
  const __m256 scv = _mm256_set1_ps(scale);
  for (r = 0; r < R; ++r) {
    float* s = S + r * kTile;
    const size_t c = cnt[r];
    if (c == 0) {  // nothing visible in this tile: state unchanged
      for (size_t j = 0; j < tl; ++j) s[j] = 0.f;
      continue;
    }
    float mx = -std::numeric_limits<float>::infinity();
    size_t j = 0;
    {
      __m256 mxv = _mm256_set1_ps(mx);
      for (; j + 8 <= c; j += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + j), scv);
        _mm256_storeu_ps(s + j, v);
        mxv = _mm256_max_ps(mxv, v);
      }
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(mxv), _mm256_extractf128_ps(mxv, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_movehdup_ps(h));
      mx = _mm_cvtss_f32(h);
    }
    for (; j < c; ++j) {
      s[j] *= scale;
      mx = std::max(mx, s[j]);
    }
    float mnew, corr;
    const float sum = exp_scores_avx2(s, c, m[r], mx, &mnew, &corr);
    for (j = c; j < tl; ++j) s[j] = 0.f;
    l[r] = l[r] * corr + sum;
    m[r] = mnew;
    if (corr != 1.f) {
      const __m256 cv = _mm256_set1_ps(corr);
      float* a = acc + r * hd;
      for (size_t d = 0; d < hd; d += 8) _mm256_storeu_ps(a + d, _mm256_mul_ps(_mm256_loadu_ps(a + d), cv));
    }
  }
  for (r = 0; r + 6 <= R; r += 6) pv_rows<6>(S + r * kTile, vg, tl, hd, acc + r * hd);
  for (; r < R; ++r) pv_rows<1>(S + r * kTile, vg, tl, hd, acc + r * hd);
}
#endif

using RowTileFn = void (*)(const float*, const float*, const float*, size_t, size_t, float, float*, float*, float*,
                           float*);

// Per-thread working memory of one item (see Plan::thread_floats), carved from tb.
struct ThreadBufs {
  float* ktile;
  float* vtile;
  float* srow;
  float* ktT;
  const float** qptr;
  size_t* cnt;
};

ThreadBufs thread_bufs(const Plan& p, size_t hd, float* tb) {
  ThreadBufs b{};
  b.ktile = tb;
  b.vtile = tb + kTile * hd;
  b.srow = tb + 2 * kTile * hd;           // (rows_max, kTile) scores
  b.ktT = b.srow + p.rows_max * kTile;    // (hd, kTile)
  b.qptr = reinterpret_cast<const float**>(b.ktT + hd * kTile + kTile);  // (rows_max)
  b.cnt = reinterpret_cast<size_t*>(b.qptr + p.rows_max);                // (rows_max)
  return b;
}

// Keys and values [k0, k0 + tl) of kv head g as f32 rows in the thread's tile buffers, run (block)
// by run, converted from the cache's dtype.
void gather_tile(const KvCache& kv, size_t layer, size_t g, size_t k0, size_t tl, const ThreadBufs& tb) {
  const size_t hd = kv.head_dim;
  for (size_t k = k0; k < k0 + tl;) {
    const size_t c = std::min(kv.run(k), k0 + tl - k);
    to_f32(kv.at(layer, 0, g, k), kv.dtype, tb.ktile + (k - k0) * hd, c * hd);
    to_f32(kv.at(layer, 1, g, k), kv.dtype, tb.vtile + (k - k0) * hd, c * hd);
    k += c;
  }
}

// Pass 1 for one (kv head, query block, key segment) item into its partial (acc, m, l) rows.
void run_item(const AttnArgs& a, const Plan& p, size_t item, const ThreadBufs& tb, float* acc) {
  const size_t hd = a.head_dim;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const KvCache& kv = *a.kv;
  const uint32_t dtype = kv.dtype;
  const size_t tile = tile_keys(kv);
  RowTileFn row_tile = row_tile_generic;
#if KVR_X86
  if (simd::has_avx2()) row_tile = row_tile_avx2;
  const bool block = simd::has_avx2() && hd % 8 == 0;
#endif
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const size_t seg = item % p.splits;
  const size_t qb = (item / p.splits) % p.nqb;
  const size_t g = item / (p.splits * p.nqb);
  const size_t i0 = qb * p.qblock, i1 = std::min(a.n, i0 + p.qblock);
  const size_t rows = (i1 - i0) * p.group;
  const size_t kend = a.pos0 + i1;  // keys [0, kend) visible to the block's last query
  const size_t ntiles = (kend + tile - 1) / tile;
  const size_t t_begin = ntiles * seg / p.splits, t_end = ntiles * (seg + 1) / p.splits;
  float* mrow = acc + p.rows_max * hd;  // (rows)
  float* lrow = mrow + p.rows_max;      // (rows)
  for (size_t r = 0; r < rows; ++r) {
    mrow[r] = neg_inf;
    lrow[r] = 0.f;
  }
  std::fill(acc, acc + rows * hd, 0.f);
#if KVR_X86
  const bool use_block = block && rows >= kBlockMinRows;
#endif
  for (size_t tt = t_begin; tt < t_end; ++tt) {
    const size_t k0 = tt * tile;
    const size_t tl = std::min(tile, kend - k0);
#if KVR_X86
    // The block kernel reads f32 keys in place by 8 (a paged cache's blocks are powers of two of at
    // least 8 tokens, so 8 keys from a multiple of 8 lie in one block); else the tile is gathered.
    if (use_block) {
      const float* kg[kTile / 8];
      const float* vg[kTile / 8];
      bool in_place = dtype == KVR_DTYPE_F32;
      for (size_t j = 0; in_place && j < tl; j += 8) {
        in_place = kv.run(k0 + j) >= std::min<size_t>(8, tl - j);
        kg[j / 8] = reinterpret_cast<const float*>(kv.at(a.layer, 0, g, k0 + j));
        vg[j / 8] = reinterpret_cast<const float*>(kv.at(a.layer, 1, g, k0 + j));
      }
      if (!in_place) {
        gather_tile(kv, a.layer, g, k0, tl, tb);
        for (size_t j = 0; j < tl; j += 8) {
          kg[j / 8] = tb.ktile + j * hd;
          vg[j / 8] = tb.vtile + j * hd;
        }
      }
      for (size_t qi = 0; qi < i1 - i0; ++qi) {
        const size_t end = a.pos0 + i0 + qi + 1;
        const size_t c = end <= k0 ? 0 : std::min(tl, end - k0);
        for (size_t gi = 0; gi < p.group; ++gi) {
          const size_t r = qi * p.group + gi;
          tb.qptr[r] = a.q + (i0 + qi) * a.ldq + (g * p.group + gi) * hd;
          tb.cnt[r] = c;
        }
      }
      block_tile_avx2(tb.qptr, tb.cnt, rows, kg, vg, tl, hd, scale, tb.ktT, tb.srow, mrow, lrow, acc);
      continue;
    }
#endif
    const float* kt;
    const float* vt;
    if (dtype == KVR_DTYPE_F32 && kv.run(k0) >= tl) {  // one run: read in place
      kt = reinterpret_cast<const float*>(kv.at(a.layer, 0, g, k0));
      vt = reinterpret_cast<const float*>(kv.at(a.layer, 1, g, k0));
    } else {
      gather_tile(kv, a.layer, g, k0, tl, tb);
      kt = tb.ktile;
      vt = tb.vtile;
    }
    for (size_t qi = 0; qi < i1 - i0; ++qi) {
      const size_t end = a.pos0 + i0 + qi + 1;  // this query sees keys [0, end)
      if (end <= k0) continue;
      const size_t c = std::min(tl, end - k0);
      for (size_t gi = 0; gi < p.group; ++gi) {
        const size_t r = qi * p.group + gi;
        const size_t h = g * p.group + gi;
        const float* q = a.q + (i0 + qi) * a.ldq + h * hd;
        row_tile(q, kt, vt, c, hd, scale, tb.srow, mrow + r, lrow + r, acc + r * hd);
      }
    }
  }
}

// Pass 2 for one (kv head, query block) b: merges its segments' partials (p.splits consecutive
// items starting at `partial`) and normalises into out.
void merge_block(const AttnArgs& a, const Plan& p, size_t b, const float* partial) {
  const size_t hd = a.head_dim;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const size_t qb = b % p.nqb, g = b / p.nqb;
  const size_t i0 = qb * p.qblock, i1 = std::min(a.n, i0 + p.qblock);
  const size_t rows = (i1 - i0) * p.group;
  for (size_t r = 0; r < rows; ++r) {
    const size_t qi = r / p.group, gi = r % p.group;
    float* o = a.out + (i0 + qi) * a.ldo + (g * p.group + gi) * hd;
    float mmax = neg_inf;
    for (size_t s = 0; s < p.splits; ++s) {
      const float* base = partial + s * p.partial_per_item;
      mmax = std::max(mmax, base[p.rows_max * hd + r]);
    }
    float denom = 0.f;
    for (size_t t = 0; t < hd; ++t) o[t] = 0.f;
    for (size_t s = 0; s < p.splits; ++s) {
      const float* base = partial + s * p.partial_per_item;
      const float ms = base[p.rows_max * hd + r];
      if (ms == neg_inf) continue;
      const float w = std::exp(ms - mmax);
      denom += w * base[p.rows_max * hd + p.rows_max + r];
      const float* acc = base + r * hd;
      for (size_t t = 0; t < hd; ++t) o[t] += w * acc[t];
    }
    const float inv = 1.f / denom;
    for (size_t t = 0; t < hd; ++t) o[t] *= inv;
  }
}

// A 64-byte aligned float pointer at or after p.
float* align64(float* p) {
  return p + (16 - (reinterpret_cast<uintptr_t>(p) / sizeof(float)) % 16) % 16;
}

}  // namespace

size_t attention_group_scratch_floats(const AttnArgs& a) {
  const Plan p = make_plan(a);
  return ((p.partial_per_item + 15) & ~size_t{15}) + p.thread_floats + 32;
}

void attention_group(const AttnArgs& a, size_t g, float* scratch) {
  const Plan p = make_plan(a);
  float* s = align64(scratch);
  float* tbase = align64(s + ((p.partial_per_item + 15) & ~size_t{15}));
  const ThreadBufs tb = thread_bufs(p, a.head_dim, tbase);
  for (size_t qb = 0; qb < p.nqb; ++qb) {
    const size_t b = g * p.nqb + qb;  // splits = 1: item index = block index
    run_item(a, p, b, tb, s);
    merge_block(a, p, b, s);
  }
}

}  // namespace kvr::cpu
