// Two-pass decode attention (see decode_attention.h) in fixed blocks of kDecodeBlock positions:
// scores and a max per block, then per block exp(score - the head's max), a partial sum and a
// partial Σ p·v, then the partials added in block order. Keys and values are read in place from
// f32 caches and converted a block at a time from f16/bf16 ones.
#include "cpu/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/convert.h"
#include "cpu/simd.h"
#include "cpu/vec_math.h"
#include "dtype.h"
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

// Asks for the next chunk's rows in L2 while this one is computed. Without it a long context
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
void scores_generic(const float* q, const float* k, size_t c, size_t hd, float scale, float* s) {
  for (size_t j = 0; j < c; ++j) {
    float d = 0.f;
    for (size_t t = 0; t < hd; ++t) d += q[t] * k[j * hd + t];
    s[j] = d * scale;
  }
}

// acc (hd) += Σ_j p[j] · v_j over the c values v (c, hd).
void pv_generic(const float* p, const float* v, size_t c, size_t hd, float* acc) {
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
// hd % 8 == 0: 8 keys at a time, reduced with a horizontal-add transpose.
KVR_TARGET_AVX2 void scores_avx2(const float* q, const float* k, size_t c, size_t hd, float scale, float* s) {
  const __m256 scv = _mm256_set1_ps(scale);
  size_t j = 0;
  for (; j + 8 <= c; j += 8) {
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
    for (size_t t = 0; t < hd; t += 8) {
      const __m256 qv = _mm256_loadu_ps(q + t);
      for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (j + i) * hd + t), a[i]);
    }
    const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    const __m256 sum8 = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
    _mm256_storeu_ps(s + j, _mm256_mul_ps(sum8, scv));
  }
  for (; j < c; ++j) {
    __m256 a = _mm256_setzero_ps();
    for (size_t t = 0; t < hd; t += 8)
      a = _mm256_fmadd_ps(_mm256_loadu_ps(q + t), _mm256_loadu_ps(k + j * hd + t), a);
    s[j] = hsum8(a) * scale;
  }
}

KVR_TARGET_AVX2 void pv_avx2(const float* p, const float* v, size_t c, size_t hd, float* acc) {
  size_t t = 0;
  for (; t + 32 <= hd; t += 32) {
    __m256 o0 = _mm256_loadu_ps(acc + t), o1 = _mm256_loadu_ps(acc + t + 8);
    __m256 o2 = _mm256_loadu_ps(acc + t + 16), o3 = _mm256_loadu_ps(acc + t + 24);
    for (size_t j = 0; j < c; ++j) {
      const __m256 pb = _mm256_broadcast_ss(p + j);
      const float* vr = v + j * hd + t;
      o0 = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vr), o0);
      o1 = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vr + 8), o1);
      o2 = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vr + 16), o2);
      o3 = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vr + 24), o3);
    }
    _mm256_storeu_ps(acc + t, o0);
    _mm256_storeu_ps(acc + t + 8, o1);
    _mm256_storeu_ps(acc + t + 16, o2);
    _mm256_storeu_ps(acc + t + 24, o3);
  }
  for (; t < hd; t += 8) {  // hd % 8 == 0
    __m256 o = _mm256_loadu_ps(acc + t);
    for (size_t j = 0; j < c; ++j) o = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(v + j * hd + t), o);
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

KVR_TARGET_AVX512 void scores_avx512(const float* q, const float* k, size_t c, size_t hd, float scale, float* s) {
  const __m512 scv = _mm512_set1_ps(scale);
  size_t j = 0;
  for (; j + 16 <= c; j += 16) {
    __m512 a[16];
    for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
    for (size_t t = 0; t < hd; t += 16) {
      const __m512 qv = _mm512_loadu_ps(q + t);
      for (int i = 0; i < 16; ++i) a[i] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + (j + i) * hd + t), a[i]);
    }
    _mm512_storeu_ps(s + j, _mm512_mul_ps(sum16x16(a), scv));
  }
  for (; j < c; ++j) {
    __m512 a = _mm512_setzero_ps();
    for (size_t t = 0; t < hd; t += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + t), _mm512_loadu_ps(k + j * hd + t), a);
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
template <int NB>
KVR_TARGET_AVX512 void pv_cols_avx512(const float* p, const float* v, size_t c, size_t hd, float* acc) {
  __m512 o[NB], e[NB];
  for (int i = 0; i < NB; ++i) {
    o[i] = _mm512_loadu_ps(acc + 16 * i);
    e[i] = _mm512_setzero_ps();
  }
  size_t j = 0;
  for (; j + 2 <= c; j += 2) {
    const __m512 p0 = _mm512_set1_ps(p[j]), p1 = _mm512_set1_ps(p[j + 1]);
    const float* v0 = v + j * hd;
    for (int i = 0; i < NB; ++i) {
      o[i] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v0 + 16 * i), o[i]);
      e[i] = _mm512_fmadd_ps(p1, _mm512_loadu_ps(v0 + hd + 16 * i), e[i]);
    }
  }
  if (j < c) {
    const __m512 p0 = _mm512_set1_ps(p[j]);
    for (int i = 0; i < NB; ++i) o[i] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v + j * hd + 16 * i), o[i]);
  }
  for (int i = 0; i < NB; ++i) _mm512_storeu_ps(acc + 16 * i, _mm512_add_ps(o[i], e[i]));
}

// Columns in blocks of up to 128 (8 accumulators + 8 for odd keys: 16 of the 32 zmm registers).
KVR_TARGET_AVX512 void pv_avx512(const float* p, const float* v, size_t c, size_t hd, float* acc) {
  for (size_t t = 0; t < hd; t += 128) {
    switch (std::min<size_t>(8, (hd - t) / 16)) {
      case 8: pv_cols_avx512<8>(p, v + t, c, hd, acc + t); break;
      case 7: pv_cols_avx512<7>(p, v + t, c, hd, acc + t); break;
      case 6: pv_cols_avx512<6>(p, v + t, c, hd, acc + t); break;
      case 5: pv_cols_avx512<5>(p, v + t, c, hd, acc + t); break;
      case 4: pv_cols_avx512<4>(p, v + t, c, hd, acc + t); break;
      case 3: pv_cols_avx512<3>(p, v + t, c, hd, acc + t); break;
      case 2: pv_cols_avx512<2>(p, v + t, c, hd, acc + t); break;
      default: pv_cols_avx512<1>(p, v + t, c, hd, acc + t); break;
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

struct Kernels {
  void (*scores)(const float*, const float*, size_t, size_t, float, float*) = scores_generic;
  void (*pv)(const float*, const float*, size_t, size_t, float*) = pv_generic;
  float (*exp_sum)(float*, size_t, float) = exp_sum_generic;
};

Kernels pick_kernels(size_t hd) {
  Kernels k;
#if KVR_X86
  if (simd::has_avx2() && hd % 8 == 0) {
    k.scores = scores_avx2;
    k.pv = pv_avx2;
    k.exp_sum = exp_sum_avx2;
  }
  if (simd::has_avx512f() && hd % 16 == 0) {
    k.scores = scores_avx512;
    k.pv = pv_avx512;
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

}  // namespace

void decode_scores_block(const AttnArgs& a, size_t g, const float* q, size_t b, const DecodeParts& d, float* tmp) {
  const size_t hd = a.head_dim, group = a.heads / a.kv_heads, L = a.pos0 + 1;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const KvCache& kv = *a.kv;
  const Kernels& k = kernels(hd);
  const size_t row_bytes = hd * dtype_size(kv.dtype);
  const size_t p0 = b * kDecodeBlock, p1 = std::min(L, p0 + kDecodeBlock);
  for (size_t p = p0; p < p1;) {  // the block's contiguous runs (a paged cache may cut it)
    const size_t c = std::min(kv.run(p), p1 - p);
    prefetch_rows(kv, a.layer, 0, g, p + c, L, row_bytes);
    const uint8_t* kp = kv.at(a.layer, 0, g, p);
    const float* keys = reinterpret_cast<const float*>(kp);
    if (kv.dtype != KVR_DTYPE_F32) {
      to_f32(kp, kv.dtype, tmp, c * hd);
      keys = tmp;
    }
    for (size_t r = 0; r < group; ++r) k.scores(q + r * hd, keys, c, hd, scale, d.S + r * d.ldS + p);
    p += c;
  }
  for (size_t r = 0; r < group; ++r) d.bmax[r * round16(d.nb) + b] = max_of(d.S + r * d.ldS + p0, p1 - p0);
}

void decode_values_block(const AttnArgs& a, size_t g, size_t b, const DecodeParts& d, float* tmp) {
  const size_t hd = a.head_dim, group = a.heads / a.kv_heads, L = a.pos0 + 1, ldB = round16(d.nb);
  const KvCache& kv = *a.kv;
  const Kernels& k = kernels(hd);
  const size_t row_bytes = hd * dtype_size(kv.dtype);
  const size_t p0 = b * kDecodeBlock, p1 = std::min(L, p0 + kDecodeBlock);
  for (size_t r = 0; r < group; ++r) {
    const float mx = max_of(d.bmax + r * ldB, d.nb);  // the head's max over every block
    d.bsum[r * ldB + b] = k.exp_sum(d.S + r * d.ldS + p0, p1 - p0, mx);  // unnormalised softmax
    float* acc = d.bacc + (r * d.nb + b) * d.ldA;
    std::fill(acc, acc + hd, 0.f);
  }
  for (size_t p = p0; p < p1;) {
    const size_t c = std::min(kv.run(p), p1 - p);
    prefetch_rows(kv, a.layer, 1, g, p + c, L, row_bytes);
    const uint8_t* vp = kv.at(a.layer, 1, g, p);
    const float* v = reinterpret_cast<const float*>(vp);
    if (kv.dtype != KVR_DTYPE_F32) {
      to_f32(vp, kv.dtype, tmp, c * hd);
      v = tmp;
    }
    for (size_t r = 0; r < group; ++r) k.pv(d.S + r * d.ldS + p, v, c, hd, d.bacc + (r * d.nb + b) * d.ldA);
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
  prefetch_rows(*a.kv, a.layer, 0, g, 0, a.pos0 + 1, hd * dtype_size(a.kv->dtype));
  for (size_t b = 0; b < d.nb; ++b) decode_scores_block(a, g, q, b, d, tmp);
  prefetch_rows(*a.kv, a.layer, 1, g, 0, a.pos0 + 1, hd * dtype_size(a.kv->dtype));
  for (size_t b = 0; b < d.nb; ++b) decode_values_block(a, g, b, d, tmp);
  decode_combine(a, g, d, a.out + g * group * hd);
}

}  // namespace kvr::cpu
