// Two-pass decode attention (see decode_attention.h) in fixed blocks of kDecodeBlock positions:
// scores and a max per block, then per block exp(score - the head's max), a partial sum and a
// partial Σ p·v, then the partials added in block order. Keys and values are read in place, f16
// and bf16 ones widened in registers by the AVX2/AVX-512 kernels (the portable path converts a
// block at a time first).
#include "cpu/decode_attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/vec_math.h"
#include "host/convert.h"
#include "host/dtype.h"
#include "host/simd.h"
#include "kvrelay.h"

#if KVR_X86
#define KVR_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#endif

namespace kvr::cpu {
namespace {

// Positions per pass over the group's heads: converted at a time from a non-f32 cache, and the
// block of keys (or values) every head of the group reads while it is in L1 (64 rows of a
// 128-wide head: 32 KiB).
constexpr size_t kChunk = kDecodeBlock;

size_t round16(size_t n) { return (n + 15) & ~size_t{15}; }

// Asks for the next chunk's rows in L2 while this one is computed (the one-head kernels; the pair
// kernels prefetch as they read, see prefetch_span). Without it a long context
// (tens of MiB of cache per token, e.g. Qwen3-0.6B at 512 positions) read at 5.5 GB/s per thread,
// latency-bound: a 16-key block touches 16 rows at once, which the hardware prefetcher does not
// follow (measured, docs/native.md "Decode step").
void prefetch_rows(const KvCache& kv, size_t layer, size_t which, size_t g, size_t p, size_t L, size_t row_bytes) {
  if (p >= L) return;
  const size_t c = std::min({kv.run(p), L - p, kChunk});
  const char* base = reinterpret_cast<const char*>(kv.at(layer, which, g, p));
  for (size_t off = 0; off < c * row_bytes; off += 64) __builtin_prefetch(base + off, 0, 2);
}

// s[j] = scale · q·k_j for the c keys k (c, hd).
void scores_generic(const float* q, const void* kb, size_t c, size_t hd, float scale, float* s) {
  const float* k = static_cast<const float*>(kb);
  for (size_t j = 0; j < c; ++j) {
    float d = 0.f;
    for (size_t t = 0; t < hd; ++t) d += q[t] * k[j * hd + t];
    s[j] = d * scale;
  }
}

// acc (hd) += Σ_j p[j] · v_j over the c values v (c, hd).
void pv_generic(const float* p, const void* vb, size_t c, size_t hd, float* acc) {
  const float* v = static_cast<const float*>(vb);
  for (size_t j = 0; j < c; ++j)
    for (size_t t = 0; t < hd; ++t) acc[t] += p[j] * v[j * hd + t];
}

// exp(s[j] - mx) in place over n scores; returns their sum.
float exp_sum_generic(float* s, size_t n, float mx) {
  float sum = 0.f;
  for (size_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  return sum;
}

#if KVR_X86
// Cache elements as f32 vectors, 8 (AVX2) or 16 (AVX-512) at a time. The widenings are exact
// (f16 → f32 by vcvtph2ps, bf16 → f32 a 16-bit shift), so a kernel reading an f16/bf16 cache in
// place computes, bit for bit, what it computes on rows converted first — with half the bytes
// read: decode attention over a long context is a stream of the cache (Qwen3-0.6B at 512
// positions: 117 MB per token at f32).
struct F32Rows {
  using T = float;
  KVR_TARGET_AVX2 static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
  KVR_TARGET_AVX512 static __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
};
struct F16Rows {
  using T = uint16_t;
  KVR_TARGET_AVX2 static __m256 load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  KVR_TARGET_AVX512 static __m512 load16(const uint16_t* p) {  // maskz: see unpacklo below
    return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};
struct Bf16Rows {
  using T = uint16_t;
  KVR_TARGET_AVX2 static __m256 load8(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // maskz forms: see unpacklo below
  KVR_TARGET_AVX512 static __m512 load16(const uint16_t* p) {
    const __m512i w = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, w, 16));
  }
};

// hd % 8 == 0: 8 keys at a time, reduced with a horizontal-add transpose.
template <class E>
KVR_TARGET_AVX2 void scores_avx2(const float* q, const void* kb, size_t c, size_t hd, float scale, float* s) {
  const typename E::T* k = static_cast<const typename E::T*>(kb);
  const __m256 scv = _mm256_set1_ps(scale);
  size_t j = 0;
  for (; j + 8 <= c; j += 8) {
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
    for (size_t t = 0; t < hd; t += 8) {
      const __m256 qv = _mm256_loadu_ps(q + t);
      for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(qv, E::load8(k + (j + i) * hd + t), a[i]);
    }
    const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    const __m256 sum8 = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
    _mm256_storeu_ps(s + j, _mm256_mul_ps(sum8, scv));
  }
  for (; j < c; ++j) {
    __m256 a = _mm256_setzero_ps();
    for (size_t t = 0; t < hd; t += 8)
      a = _mm256_fmadd_ps(_mm256_loadu_ps(q + t), E::load8(k + j * hd + t), a);
    s[j] = hsum8(a) * scale;
  }
}

template <class E>
KVR_TARGET_AVX2 void pv_avx2(const float* p, const void* vb, size_t c, size_t hd, float* acc) {
  const typename E::T* v = static_cast<const typename E::T*>(vb);
  size_t t = 0;
  for (; t + 32 <= hd; t += 32) {
    __m256 o0 = _mm256_loadu_ps(acc + t), o1 = _mm256_loadu_ps(acc + t + 8);
    __m256 o2 = _mm256_loadu_ps(acc + t + 16), o3 = _mm256_loadu_ps(acc + t + 24);
    for (size_t j = 0; j < c; ++j) {
      const __m256 pb = _mm256_broadcast_ss(p + j);
      const typename E::T* vr = v + j * hd + t;
      o0 = _mm256_fmadd_ps(pb, E::load8(vr), o0);
      o1 = _mm256_fmadd_ps(pb, E::load8(vr + 8), o1);
      o2 = _mm256_fmadd_ps(pb, E::load8(vr + 16), o2);
      o3 = _mm256_fmadd_ps(pb, E::load8(vr + 24), o3);
    }
    _mm256_storeu_ps(acc + t, o0);
    _mm256_storeu_ps(acc + t + 8, o1);
    _mm256_storeu_ps(acc + t + 16, o2);
    _mm256_storeu_ps(acc + t + 24, o3);
  }
  for (; t < hd; t += 8) {  // hd % 8 == 0
    __m256 o = _mm256_loadu_ps(acc + t);
    for (size_t j = 0; j < c; ++j) o = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), E::load8(v + j * hd + t), o);
    _mm256_storeu_ps(acc + t, o);
  }
}

KVR_TARGET_AVX2 float exp_sum_avx2(float* s, size_t n, float mx) {
  const __m256 mv = _mm256_set1_ps(mx);
  __m256 sv = _mm256_setzero_ps();
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    _mm256_storeu_ps(s + j, e);
    sv = _mm256_add_ps(sv, e);
  }
  float sum = hsum8(sv);
  for (; j < n; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  return sum;
}

// AVX-512F (head_dim % 16 == 0). Scores: 16 keys at a time, each key's products accumulated in
// one zmm over head_dim, the 16 vectors then reduced by a transpose-add tree into one vector of
// 16 scores (about 3 instructions per key instead of a horizontal sum each).
// maskz forms: GCC 12's plain unpack/shuffle intrinsics pass an undefined vector that
// -Werror=maybe-uninitialized rejects.
KVR_TARGET_AVX512 inline __m512 unpacklo(__m512 a, __m512 b) { return _mm512_maskz_unpacklo_ps(0xFFFF, a, b); }
KVR_TARGET_AVX512 inline __m512 unpackhi(__m512 a, __m512 b) { return _mm512_maskz_unpackhi_ps(0xFFFF, a, b); }
template <int kImm>
KVR_TARGET_AVX512 inline __m512 lanes(__m512 a, __m512 b) { return _mm512_maskz_shuffle_f32x4(0xFFFF, a, b, kImm); }

KVR_TARGET_AVX512 inline float hsum16(__m512 a) {
  __m512 t = _mm512_add_ps(a, lanes<0x4E>(a, a));
  t = _mm512_add_ps(t, lanes<0xB1>(t, t));
  __m128 s = _mm512_maskz_extractf32x4_ps(0xF, t, 0);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

KVR_TARGET_AVX512 inline __m512 sum16x16(__m512* a) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    b[i] = _mm512_add_ps(unpacklo(a[2 * i], a[2 * i + 1]), unpackhi(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per lane: the lane's sums of 4 keys
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44), _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
  for (int i = 0; i < 2; ++i)  // lanes (0+2, 1+3) of two 4-key groups
    d[i] = _mm512_add_ps(lanes<0x44>(c[2 * i], c[2 * i + 1]), lanes<0xEE>(c[2 * i], c[2 * i + 1]));
  return _mm512_add_ps(lanes<0x88>(d[0], d[1]), lanes<0xDD>(d[0], d[1]));
}

template <class E>
KVR_TARGET_AVX512 void scores_avx512(const float* q, const void* kb, size_t c, size_t hd, float scale, float* s) {
  const typename E::T* k = static_cast<const typename E::T*>(kb);
  const __m512 scv = _mm512_set1_ps(scale);
  size_t j = 0;
  for (; j + 16 <= c; j += 16) {
    __m512 a[16];
    for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
    for (size_t t = 0; t < hd; t += 16) {
      const __m512 qv = _mm512_loadu_ps(q + t);
      for (int i = 0; i < 16; ++i) a[i] = _mm512_fmadd_ps(qv, E::load16(k + (j + i) * hd + t), a[i]);
    }
    _mm512_storeu_ps(s + j, _mm512_mul_ps(sum16x16(a), scv));
  }
  for (; j < c; ++j) {
    __m512 a = _mm512_setzero_ps();
    for (size_t t = 0; t < hd; t += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + t), E::load16(k + j * hd + t), a);
    s[j] = hsum16(a) * scale;
  }
}

// max(s[0..n)) (n >= 1): the same value as the scalar loop (max is exact and order-free, and
// scores are never NaN: finite q·k sums), 16 at a time.
KVR_TARGET_AVX512 float max_avx512(const float* s, size_t n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  size_t j = 0;
  // maskz forms: see unpacklo above
  for (; j + 16 <= n; j += 16) m = _mm512_maskz_max_ps(0xFFFF, m, _mm512_loadu_ps(s + j));
  alignas(64) float lanes16[16];
  _mm512_store_ps(lanes16, m);
  float mx = lanes16[0];
  for (int i = 1; i < 16; ++i) mx = std::max(mx, lanes16[i]);
  for (; j < n; ++j) mx = std::max(mx, s[j]);
  return mx;
}

// acc[0, 16·NB) += Σ_j p[j] · v_j[0, 16·NB) (v rows of stride hd): even and odd keys in two
// register sets so consecutive FMAs into one accumulator do not wait on each other.
template <int NB, class E>
KVR_TARGET_AVX512 void pv_cols_avx512(const float* p, const typename E::T* v, size_t c, size_t hd, float* acc) {
  __m512 o[NB], e[NB];
  for (int i = 0; i < NB; ++i) {
    o[i] = _mm512_loadu_ps(acc + 16 * i);
    e[i] = _mm512_setzero_ps();
  }
  size_t j = 0;
  for (; j + 2 <= c; j += 2) {
    const __m512 p0 = _mm512_set1_ps(p[j]), p1 = _mm512_set1_ps(p[j + 1]);
    const typename E::T* v0 = v + j * hd;
    for (int i = 0; i < NB; ++i) {
      o[i] = _mm512_fmadd_ps(p0, E::load16(v0 + 16 * i), o[i]);
      e[i] = _mm512_fmadd_ps(p1, E::load16(v0 + hd + 16 * i), e[i]);
    }
  }
  if (j < c) {
    const __m512 p0 = _mm512_set1_ps(p[j]);
    for (int i = 0; i < NB; ++i) o[i] = _mm512_fmadd_ps(p0, E::load16(v + j * hd + 16 * i), o[i]);
  }
  for (int i = 0; i < NB; ++i) _mm512_storeu_ps(acc + 16 * i, _mm512_add_ps(o[i], e[i]));
}

// Columns in blocks of up to 128 (8 accumulators + 8 for odd keys: 16 of the 32 zmm registers).
template <class E>
KVR_TARGET_AVX512 void pv_avx512(const float* p, const void* vb, size_t c, size_t hd, float* acc) {
  const typename E::T* v = static_cast<const typename E::T*>(vb);
  for (size_t t = 0; t < hd; t += 128) {
    switch (std::min<size_t>(8, (hd - t) / 16)) {
      case 8: pv_cols_avx512<8, E>(p, v + t, c, hd, acc + t); break;
      case 7: pv_cols_avx512<7, E>(p, v + t, c, hd, acc + t); break;
      case 6: pv_cols_avx512<6, E>(p, v + t, c, hd, acc + t); break;
      case 5: pv_cols_avx512<5, E>(p, v + t, c, hd, acc + t); break;
      case 4: pv_cols_avx512<4, E>(p, v + t, c, hd, acc + t); break;
      case 3: pv_cols_avx512<3, E>(p, v + t, c, hd, acc + t); break;
      case 2: pv_cols_avx512<2, E>(p, v + t, c, hd, acc + t); break;
      default: pv_cols_avx512<1, E>(p, v + t, c, hd, acc + t); break;
    }
  }
}

// The pair kernels below ask for the rows kAhead bytes ahead of the ones they read, a few lines at
// a time (as the q8 GEMV does, gemm_q8.cpp), instead of the next chunk in bulk: measured on
// Qwen3-0.6B at 512 positions (timing build, median of 64 steps, 2 threads), a thread's attention
// took 2.75 instead of 3.37 ms per token with an f16 cache and 4.3 instead of 4.8 ms with f32;
// 2 KiB, 4 KiB or 8 KiB ahead and T0/T1/T2 hints all within ±0.1 ms of each other.
constexpr size_t kAhead = 2048;
KVR_TARGET_AVX512 inline void prefetch_span(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p) + kAhead;
  for (size_t l = 0; l < bytes; l += 64) _mm_prefetch(c + l, _MM_HINT_T0);  // never faults
}

// Two query heads of a GQA group at a time (they read the same keys and values): each key or
// value row is loaded — and widened — once for both heads, where a head at a time read every row
// twice (from L1/L2 the second time; with the data in L2 that was ~15 µs per Qwen3-0.6B group at
// 512 positions, on top of the memory time). Scores: 8 keys × 2 heads, the 16 dot vectors
// reduced by the same transpose-add tree into one vector (head 0's 8 scores, then head 1's).
template <class E>
KVR_TARGET_AVX512 void scores2_avx512(const float* q0, const float* q1, const void* kb, size_t c, size_t hd,
                                      float scale, float* s0, float* s1) {
  const typename E::T* k = static_cast<const typename E::T*>(kb);
  const __m512 scv = _mm512_set1_ps(scale);
  size_t j = 0;
  for (; j + 8 <= c; j += 8) {
    prefetch_span(k + j * hd, 8 * hd * sizeof(typename E::T));
    __m512 a[16];
    for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
    for (size_t t = 0; t < hd; t += 16) {
      const __m512 qa = _mm512_loadu_ps(q0 + t), qb = _mm512_loadu_ps(q1 + t);
      for (int i = 0; i < 8; ++i) {
        const __m512 kv = E::load16(k + (j + i) * hd + t);
        a[i] = _mm512_fmadd_ps(qa, kv, a[i]);
        a[8 + i] = _mm512_fmadd_ps(qb, kv, a[8 + i]);
      }
    }
    alignas(64) float r[16];
    _mm512_store_ps(r, _mm512_mul_ps(sum16x16(a), scv));
    std::memcpy(s0 + j, r, 8 * sizeof(float));
    std::memcpy(s1 + j, r + 8, 8 * sizeof(float));
  }
  for (; j < c; ++j) {
    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    for (size_t t = 0; t < hd; t += 16) {
      const __m512 kv = E::load16(k + j * hd + t);
      a = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + t), kv, a);
      b = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + t), kv, b);
    }
    s0[j] = hsum16(a) * scale;
    s1[j] = hsum16(b) * scale;
  }
}

// acc0/acc1[0, 16·NB) += Σ_j p0/p1[j] · v_j[0, 16·NB): 2·NB independent accumulators (as many as
// the one-head kernel's even/odd split has).
template <int NB, class E>
KVR_TARGET_AVX512 void pv2_cols_avx512(const float* p0, const float* p1, const typename E::T* v, size_t c, size_t hd,
                                       float* acc0, float* acc1) {
  __m512 o[NB], e[NB];
  for (int i = 0; i < NB; ++i) {
    o[i] = _mm512_loadu_ps(acc0 + 16 * i);
    e[i] = _mm512_loadu_ps(acc1 + 16 * i);
  }
  for (size_t j = 0; j < c; ++j) {
    const __m512 w0 = _mm512_set1_ps(p0[j]), w1 = _mm512_set1_ps(p1[j]);
    const typename E::T* vr = v + j * hd;
    prefetch_span(vr, NB * 16 * sizeof(typename E::T));
    for (int i = 0; i < NB; ++i) {
      const __m512 x = E::load16(vr + 16 * i);
      o[i] = _mm512_fmadd_ps(w0, x, o[i]);
      e[i] = _mm512_fmadd_ps(w1, x, e[i]);
    }
  }
  for (int i = 0; i < NB; ++i) {
    _mm512_storeu_ps(acc0 + 16 * i, o[i]);
    _mm512_storeu_ps(acc1 + 16 * i, e[i]);
  }
}

template <class E>
KVR_TARGET_AVX512 void pv2_avx512(const float* p0, const float* p1, const void* vb, size_t c, size_t hd, float* acc0,
                                  float* acc1) {
  const typename E::T* v = static_cast<const typename E::T*>(vb);
  for (size_t t = 0; t < hd; t += 128) {
    switch (std::min<size_t>(8, (hd - t) / 16)) {
      case 8: pv2_cols_avx512<8, E>(p0, p1, v + t, c, hd, acc0 + t, acc1 + t); break;
      case 7: pv2_cols_avx512<7, E>(p0, p1, v + t, c, hd, acc0 + t, acc1 + t); break;
      case 6: pv2_cols_avx512<6, E>(p0, p1, v + t, c, hd, acc0 + t, acc1 + t); break;
      case 5: pv2_cols_avx512<5, E>(p0, p1, v + t, c, hd, acc0 + t, acc1 + t); break;
      case 4: pv2_cols_avx512<4, E>(p0, p1, v + t, c, hd, acc0 + t, acc1 + t); break;
      case 3: pv2_cols_avx512<3, E>(p0, p1, v + t, c, hd, acc0 + t, acc1 + t); break;
      case 2: pv2_cols_avx512<2, E>(p0, p1, v + t, c, hd, acc0 + t, acc1 + t); break;
      default: pv2_cols_avx512<1, E>(p0, p1, v + t, c, hd, acc0 + t, acc1 + t); break;
    }
  }
}
#endif

}  // namespace

size_t decode_blocks(const AttnArgs& a) { return (a.pos0 + 1 + kDecodeBlock - 1) / kDecodeBlock; }

size_t decode_parts_floats(const AttnArgs& a) {
  const size_t group = a.kv_heads ? a.heads / a.kv_heads : 0, nb = decode_blocks(a);
  // scores (group, ldS) | block max, block sum (group, round16(nb)) each | block acc (group, nb, ldA)
  return group * round16(a.pos0 + 1) + 2 * group * round16(nb) + group * nb * round16(a.head_dim);
}

DecodeParts decode_parts(const AttnArgs& a, float* base) {
  const size_t group = a.heads / a.kv_heads, nb = decode_blocks(a);
  DecodeParts d;
  d.nb = nb;
  d.ldS = round16(a.pos0 + 1);
  d.ldA = round16(a.head_dim);
  d.S = base;
  d.bmax = d.S + group * d.ldS;
  d.bsum = d.bmax + group * round16(nb);
  d.bacc = d.bsum + group * round16(nb);
  return d;
}

size_t decode_block_scratch_floats(const AttnArgs& a) { return kChunk * round16(a.head_dim); }

size_t decode_attention_scratch_floats(const AttnArgs& a) {
  return decode_parts_floats(a) + decode_block_scratch_floats(a);
}

namespace {

// Scores and Σ p·v kernels per cache dtype (index KVR_DTYPE_F32 / F16 / BF16): rows of that
// dtype read in place; nullptr: convert a block to f32 first, then the f32 kernel.
using ScoresFn = void (*)(const float*, const void*, size_t, size_t, float, float*);
using PvFn = void (*)(const float*, const void*, size_t, size_t, float*);
// Two heads at once (scores2: q0, q1, keys, c, hd, scale, s0, s1; pv2: p0, p1, values, c, hd,
// acc0, acc1); nullptr: a head at a time.
using Scores2Fn = void (*)(const float*, const float*, const void*, size_t, size_t, float, float*, float*);
using Pv2Fn = void (*)(const float*, const float*, const void*, size_t, size_t, float*, float*);
// Indexed by kvr_dtype: the brace lists below are in that order.
static_assert(KVR_DTYPE_F32 == 0 && KVR_DTYPE_F16 == 1 && KVR_DTYPE_BF16 == 2, "kernel tables follow kvr_dtype");
struct Kernels {
  std::array<ScoresFn, 3> scores = {scores_generic, nullptr, nullptr};
  std::array<PvFn, 3> pv = {pv_generic, nullptr, nullptr};
  std::array<Scores2Fn, 3> scores2 = {nullptr, nullptr, nullptr};
  std::array<Pv2Fn, 3> pv2 = {nullptr, nullptr, nullptr};
  float (*exp_sum)(float*, size_t, float) = exp_sum_generic;
};

Kernels pick_kernels(size_t hd) {
  Kernels k;
#if KVR_X86
  if (simd::has_avx2() && hd % 8 == 0) {
    k.scores = {scores_avx2<F32Rows>, scores_avx2<F16Rows>, scores_avx2<Bf16Rows>};
    k.pv = {pv_avx2<F32Rows>, pv_avx2<F16Rows>, pv_avx2<Bf16Rows>};
    k.exp_sum = exp_sum_avx2;
  }
  if (simd::has_avx512f() && hd % 16 == 0) {
    k.scores = {scores_avx512<F32Rows>, scores_avx512<F16Rows>, scores_avx512<Bf16Rows>};
    k.pv = {pv_avx512<F32Rows>, pv_avx512<F16Rows>, pv_avx512<Bf16Rows>};
    k.scores2 = {scores2_avx512<F32Rows>, scores2_avx512<F16Rows>, scores2_avx512<Bf16Rows>};
    k.pv2 = {pv2_avx512<F32Rows>, pv2_avx512<F16Rows>, pv2_avx512<Bf16Rows>};
  }
#else
  (void)hd;
#endif
  return k;
}

// max(-inf, x[0..n)): 16 at a time (AVX-512) or in 8 independent chains — a single chain of
// dependent max operations was a visible part of a small model's decode step. Max is exact, so
// every form gives the same value.
float max_of(const float* x, size_t n) {
#if KVR_X86
  if (simd::has_avx512f()) return max_avx512(x, n);
#endif
  float m[8];
  for (float& v : m) v = -std::numeric_limits<float>::infinity();
  size_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int i = 0; i < 8; ++i) m[i] = std::max(m[i], x[j + i]);
  for (; j < n; ++j) m[0] = std::max(m[0], x[j]);
  for (int i = 1; i < 8; ++i) m[0] = std::max(m[0], m[i]);
  return m[0];
}

// The kernels for head_dim hd (CPU flags are fixed for the process: picked once per class).
const Kernels& kernels(size_t hd) {
  static const Kernels by16 = pick_kernels(16), by8 = pick_kernels(8), other = pick_kernels(1);
  return hd % 16 == 0 ? by16 : hd % 8 == 0 ? by8 : other;
}

// The dtype whose kernels read a cache of `dtype`: itself when they read it in place, else f32
// (the run is converted first).
uint32_t kernel_dtype(const Kernels& k, uint32_t dtype) {
  return dtype <= KVR_DTYPE_BF16 && k.scores[dtype] != nullptr ? dtype : uint32_t{KVR_DTYPE_F32};
}

// True when the group's heads go through the pair kernels, which prefetch as they read; the
// one-head kernels are given each next chunk in bulk (prefetch_rows).
bool paired(const Kernels& k, uint32_t dtype, size_t group) {
  return group >= 2 && k.scores2[kernel_dtype(k, dtype)] != nullptr;
}

}  // namespace

void decode_scores_block(const AttnArgs& a, size_t g, const float* q, size_t b, const DecodeParts& d, float* tmp) {
  const size_t hd = a.head_dim, group = a.heads / a.kv_heads, L = a.pos0 + 1;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const KvCache& kv = *a.kv;
  const Kernels& k = kernels(hd);
  const size_t row_bytes = hd * dtype_size(kv.dtype);
  const uint32_t dt = kernel_dtype(k, kv.dtype);
  const bool pairs = paired(k, kv.dtype, group);
  const size_t p0 = b * kDecodeBlock, p1 = std::min(L, p0 + kDecodeBlock);
  for (size_t p = p0; p < p1;) {  // the block's contiguous runs (a paged cache may cut it)
    const size_t c = std::min(kv.run(p), p1 - p);
    if (!pairs) prefetch_rows(kv, a.layer, 0, g, p + c, L, row_bytes);
    const void* keys = kv.at(a.layer, 0, g, p);
    if (dt != kv.dtype) {  // convert the run first
      to_f32(keys, kv.dtype, tmp, c * hd);
      keys = tmp;
    }
    size_t r = 0;
    if (pairs)
      for (; r + 2 <= group; r += 2)
        k.scores2[dt](q + r * hd, q + (r + 1) * hd, keys, c, hd, scale, d.S + r * d.ldS + p, d.S + (r + 1) * d.ldS + p);
    for (; r < group; ++r) k.scores[dt](q + r * hd, keys, c, hd, scale, d.S + r * d.ldS + p);
    p += c;
  }
  for (size_t r = 0; r < group; ++r) d.bmax[r * round16(d.nb) + b] = max_of(d.S + r * d.ldS + p0, p1 - p0);
}

void decode_values_block(const AttnArgs& a, size_t g, size_t b, const DecodeParts& d, float* tmp) {
  const size_t hd = a.head_dim, group = a.heads / a.kv_heads, L = a.pos0 + 1, ldB = round16(d.nb);
  const KvCache& kv = *a.kv;
  const Kernels& k = kernels(hd);
  const size_t row_bytes = hd * dtype_size(kv.dtype);
  const uint32_t dt = kernel_dtype(k, kv.dtype);
  const bool pairs = paired(k, kv.dtype, group);
  const size_t p0 = b * kDecodeBlock, p1 = std::min(L, p0 + kDecodeBlock);
  for (size_t r = 0; r < group; ++r) {
    const float mx = max_of(d.bmax + r * ldB, d.nb);  // the head's max over every block
    d.bsum[r * ldB + b] = k.exp_sum(d.S + r * d.ldS + p0, p1 - p0, mx);  // unnormalised softmax
    float* acc = d.bacc + (r * d.nb + b) * d.ldA;
    std::fill(acc, acc + hd, 0.f);
  }
  for (size_t p = p0; p < p1;) {
    const size_t c = std::min(kv.run(p), p1 - p);
    if (!pairs) prefetch_rows(kv, a.layer, 1, g, p + c, L, row_bytes);
    const void* v = kv.at(a.layer, 1, g, p);
    if (dt != kv.dtype) {  // convert the run first
      to_f32(v, kv.dtype, tmp, c * hd);
      v = tmp;
    }
    auto acc = [&](size_t r) { return d.bacc + (r * d.nb + b) * d.ldA; };
    size_t r = 0;
    if (pairs)
      for (; r + 2 <= group; r += 2)
        k.pv2[dt](d.S + r * d.ldS + p, d.S + (r + 1) * d.ldS + p, v, c, hd, acc(r), acc(r + 1));
    for (; r < group; ++r) k.pv[dt](d.S + r * d.ldS + p, v, c, hd, acc(r));
    p += c;
  }
}

namespace {
// o[0, n) = Σ_b acc[b·ld + t] (b in order), then × inv; element-wise, so vectorising keeps the bits.
void add_blocks(const float* __restrict acc, size_t nb, size_t ld, size_t n, float inv, float* __restrict o) {
  for (size_t t = 0; t < n; ++t) o[t] = acc[t];
  for (size_t b = 1; b < nb; ++b) {
    const float* __restrict ab = acc + b * ld;
    for (size_t t = 0; t < n; ++t) o[t] += ab[t];
  }
  for (size_t t = 0; t < n; ++t) o[t] *= inv;
}
}  // namespace

void decode_combine(const AttnArgs& a, size_t g, const DecodeParts& d, float* out) {
  const size_t hd = a.head_dim, group = a.heads / a.kv_heads, ldB = round16(d.nb);
  (void)g;
  for (size_t r = 0; r < group; ++r) {
    float sum = 0.f;
    for (size_t b = 0; b < d.nb; ++b) sum += d.bsum[r * ldB + b];
    add_blocks(d.bacc + r * d.nb * d.ldA, d.nb, d.ldA, hd, 1.f / sum, out + r * hd);
  }
}

void decode_attention(const AttnArgs& a, float* scratch) {
  for (size_t g = 0; g < a.kv_heads; ++g) decode_attention_group(a, g, scratch);
}

void decode_attention_group(const AttnArgs& a, size_t g, float* scratch) {
  const size_t hd = a.head_dim, group = a.heads / a.kv_heads;
  const DecodeParts d = decode_parts(a, scratch);
  float* tmp = scratch + decode_parts_floats(a);
  const float* q = a.q + g * group * hd;  // the group's heads follow each other in the row
  const bool pairs = paired(kernels(hd), a.kv->dtype, group);
  if (!pairs) prefetch_rows(*a.kv, a.layer, 0, g, 0, a.pos0 + 1, hd * dtype_size(a.kv->dtype));
  for (size_t b = 0; b < d.nb; ++b) decode_scores_block(a, g, q, b, d, tmp);
  if (!pairs) prefetch_rows(*a.kv, a.layer, 1, g, 0, a.pos0 + 1, hd * dtype_size(a.kv->dtype));
  for (size_t b = 0; b < d.nb; ++b) decode_values_block(a, g, b, d, tmp);
  decode_combine(a, g, d, a.out + g * group * hd);
}

}  // namespace kvr::cpu
