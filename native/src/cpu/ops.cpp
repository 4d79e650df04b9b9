// Row-wise kernels (see ops.h): portable loops plus AVX2/FMA versions of the two that show in
// profiles (RMSNorm, SwiGLU), chosen at run time. RMSNorm accumulates the mean square in double.
#include "cpu/ops.h"

#include <cmath>

#include "common/device_math.h"
#include "cpu/vec_math.h"
#include "host/simd.h"

namespace kvr::cpu {
namespace {

void rmsnorm_generic(const float* x, float* y, const float* w, size_t d, float eps) {
  double ss = 0.0;
  for (size_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
  for (size_t i = 0; i < d; ++i) y[i] = x[i] * r * w[i];
}

void swiglu_generic(const float* gate, const float* up, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

#if KVR_X86
KVR_TARGET_AVX2 void rmsnorm_avx2(const float* x, float* y, const float* w, size_t d, float eps) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    a0 = _mm256_fmadd_pd(lo, lo, a0);
    a1 = _mm256_fmadd_pd(hi, hi, a1);
  }
  alignas(32) double t[4];
  _mm256_store_pd(t, _mm256_add_pd(a0, a1));
  double ss = (t[0] + t[1]) + (t[2] + t[3]);
  for (; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
  const __m256 rv = _mm256_set1_ps(r);
  for (i = 0; i + 8 <= d; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_loadu_ps(w + i)));
  for (; i < d; ++i) y[i] = x[i] * r * w[i];
}

// dm::rope_pair on 8 pairs at a time: a·c − b·s and b·c + a·s, each product and the sum rounded
// on its own. The target has no "fma" on purpose: the compiler may then not contract the
// multiplications into fused multiply-adds, which would round differently from the scalar rule
// (and CUDA's). Returns the pairs done (a multiple of 8). Was ~0.3 µs per row of the batched
// step's q/k RoPE as scalar code.
__attribute__((target("avx2"))) size_t rope_avx(float* x, const float* cos, const float* sin, size_t half) {
  float* x2 = x + half;
  size_t i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x2 + i);
    const __m256 c = _mm256_loadu_ps(cos + i), s = _mm256_loadu_ps(sin + i);
    _mm256_storeu_ps(x + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
    _mm256_storeu_ps(x2 + i, _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
  }
  return i;
}

KVR_TARGET_AVX2 void swiglu_avx2(const float* gate, const float* up, float* out, size_t n) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 sign = _mm256_set1_ps(-0.f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp8(_mm256_xor_ps(g, sign));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  swiglu_generic(gate + i, up + i, out + i, n - i);
}
#endif

}  // namespace

void rmsnorm(const float* x, float* y, const float* w, size_t d, float eps) {
#if KVR_X86
  if (simd::has_avx2()) return rmsnorm_avx2(x, y, w, d, eps);
#endif
  rmsnorm_generic(x, y, w, d, eps);
}

void rope(float* x, const float* cos, const float* sin, size_t half) {
  float* x2 = x + half;
  size_t i = 0;
#if KVR_X86
  if (simd::has_avx2()) i = rope_avx(x, cos, sin, half);
#endif
  for (; i < half; ++i) dm::rope_pair(x[i], x2[i], cos[i], sin[i], &x[i], &x2[i]);  // as on CUDA
}

void swiglu(const float* gate, const float* up, float* out, size_t n) {
#if KVR_X86
  if (simd::has_avx2()) return swiglu_avx2(gate, up, out, n);
#endif
  swiglu_generic(gate, up, out, n);
}

void add_inplace(float* y, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += b[i];
}

}  // namespace kvr::cpu
