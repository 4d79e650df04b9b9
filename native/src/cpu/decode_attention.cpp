// Two-pass decode attention (see decode_attention.h): scores of all keys, one max/exp/sum per
// head, then the value pass. Keys and values are read in place from f32 caches and converted in
// chunks of at most kChunk positions from f16/bf16 ones.
#include "cpu/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/convert.h"
#include "cpu/simd.h"
#include "cpu/vec_math.h"
#include "kvrelay.h"

namespace kvr::cpu {
namespace {

constexpr size_t kChunk = 64;  // positions converted at a time from a non-f32 cache

size_t round16(size_t n) { return (n + 15) & ~size_t{15}; }

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
#endif

}  // namespace

size_t decode_attention_scratch_floats(const AttnArgs& a) {
  const size_t group = a.kv_heads ? a.heads / a.kv_heads : 0;
  // scores (group, L) | acc (group, hd) | K chunk, V chunk (kChunk, hd) each | sums (group)
  return group * round16(a.pos0 + 1) + group * round16(a.head_dim) + 2 * kChunk * round16(a.head_dim) +
         round16(group);
}

void decode_attention(const AttnArgs& a, float* scratch) {
  const size_t hd = a.head_dim, group = a.heads / a.kv_heads, L = a.pos0 + 1, ldS = round16(L);
  const size_t ldA = round16(hd);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const KvCache& kv = *a.kv;
  const bool f32 = kv.dtype == KVR_DTYPE_F32;
  float* S = scratch;                 // (group, ldS)
  float* acc = S + group * ldS;       // (group, ldA)
  float* kbuf = acc + group * ldA;    // (kChunk, hd)
  float* vbuf = kbuf + kChunk * ldA;  // (kChunk, hd)
  float* sums = vbuf + kChunk * ldA;  // (group)
  auto scores = scores_generic;
  auto pv = pv_generic;
  auto exp_sum = exp_sum_generic;
#if KVR_X86
  if (simd::has_avx2() && hd % 8 == 0) {
    scores = scores_avx2;
    pv = pv_avx2;
    exp_sum = exp_sum_avx2;
  }
#endif
  for (size_t g = 0; g < a.kv_heads; ++g) {
    const float* q = a.q + g * group * hd;  // the group's heads follow each other in the row
    // Pass 1: scores over every contiguous run of keys.
    for (size_t p = 0; p < L;) {
      const size_t c = std::min({kv.run(p), L - p, f32 ? L : kChunk});
      const uint8_t* kp = kv.at(a.layer, 0, g, p);
      const float* k = reinterpret_cast<const float*>(kp);
      if (!f32) {
        to_f32(kp, kv.dtype, kbuf, c * hd);
        k = kbuf;
      }
      for (size_t r = 0; r < group; ++r) scores(q + r * hd, k, c, hd, scale, S + r * ldS + p);
      p += c;
    }
    // One softmax per head (unnormalised; divided at the end).
    for (size_t r = 0; r < group; ++r) {
      float* s = S + r * ldS;
      float mx = -std::numeric_limits<float>::infinity();
      for (size_t j = 0; j < L; ++j) mx = std::max(mx, s[j]);
      sums[r] = exp_sum(s, L, mx);
      std::fill(acc + r * ldA, acc + r * ldA + hd, 0.f);
    }
    // Pass 2: values.
    for (size_t p = 0; p < L;) {
      const size_t c = std::min({kv.run(p), L - p, f32 ? L : kChunk});
      const uint8_t* vp = kv.at(a.layer, 1, g, p);
      const float* v = reinterpret_cast<const float*>(vp);
      if (!f32) {
        to_f32(vp, kv.dtype, vbuf, c * hd);
        v = vbuf;
      }
      for (size_t r = 0; r < group; ++r) pv(S + r * ldS + p, v, c, hd, acc + r * ldA);
      p += c;
    }
    for (size_t r = 0; r < group; ++r) {
      float* o = a.out + (g * group + r) * hd;
      const float inv = 1.f / sums[r];
      for (size_t t = 0; t < hd; ++t) o[t] = acc[r * ldA + t] * inv;
    }
  }
}

}  // namespace kvr::cpu
