// AVX2 + FMA micro-kernels for the packed GEMM: a 6x16 register tile (12 ymm accumulators) and a
// one-row GEMV over whole panels. Compiled per function with target attributes (no -mavx2 for
// the translation unit), so the library still loads on CPUs without AVX2; the driver calls
// these only after checking the CPU (gemm.cpp).
#include <immintrin.h>

#include "cpu/gemm_kernels.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define KVR_AVX2_TARGET __attribute__((target("avx2,fma")))
#define KVR_HAVE_AVX2_KERNELS 1
#else
#define KVR_HAVE_AVX2_KERNELS 0
#endif

namespace kvr::cpu::detail {

#if KVR_HAVE_AVX2_KERNELS
namespace {

// c (MR, 16) (+)= a (kc, 6)[:, :MR] · b (kc, 16); see TileFn.
template <int MR>
KVR_AVX2_TARGET void tile_avx2(size_t kc, const float* a, const float* b, float* c, size_t ldc,
                               bool load_c) {
  __m256 acc0[MR], acc1[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    if (load_c) {  // start fetching the C tile now; it is read only after the k loop
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 15), _MM_HINT_T0);
    }
    acc0[r] = _mm256_setzero_ps();
    acc1[r] = _mm256_setzero_ps();
  }
#pragma GCC unroll 4
  for (size_t t = 0; t < kc; ++t) {
    const __m256 b0 = _mm256_load_ps(b);
    const __m256 b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r);
      acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
    }
    a += kTileRows;
    b += 16;
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    float* row = c + r * ldc;
    if (load_c) {
      acc0[r] = _mm256_add_ps(acc0[r], _mm256_loadu_ps(row));
      acc1[r] = _mm256_add_ps(acc1[r], _mm256_loadu_ps(row + 8));
    }
    _mm256_storeu_ps(row, acc0[r]);
    _mm256_storeu_ps(row + 8, acc1[r]);
  }
}

// y (16 * n_panels) (+)= x (k) · panels; four k-phases per panel hide the FMA latency.
KVR_AVX2_TARGET void gemv_avx2(size_t k, const float* x, const float* panels, size_t n_panels,
                               float* y, bool load_y) {
  for (size_t p = 0; p < n_panels; ++p) {
    const float* b = panels + p * k * 16;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    __m256 s4 = _mm256_setzero_ps(), s5 = _mm256_setzero_ps();
    __m256 s6 = _mm256_setzero_ps(), s7 = _mm256_setzero_ps();
    size_t t = 0;
    for (; t + 4 <= k; t += 4) {
      const float* bt = b + t * 16;
      const __m256 x0 = _mm256_broadcast_ss(x + t);
      const __m256 x1 = _mm256_broadcast_ss(x + t + 1);
      const __m256 x2 = _mm256_broadcast_ss(x + t + 2);
      const __m256 x3 = _mm256_broadcast_ss(x + t + 3);
      s0 = _mm256_fmadd_ps(x0, _mm256_load_ps(bt), s0);
      s1 = _mm256_fmadd_ps(x0, _mm256_load_ps(bt + 8), s1);
      s2 = _mm256_fmadd_ps(x1, _mm256_load_ps(bt + 16), s2);
      s3 = _mm256_fmadd_ps(x1, _mm256_load_ps(bt + 24), s3);
      s4 = _mm256_fmadd_ps(x2, _mm256_load_ps(bt + 32), s4);
      s5 = _mm256_fmadd_ps(x2, _mm256_load_ps(bt + 40), s5);
      s6 = _mm256_fmadd_ps(x3, _mm256_load_ps(bt + 48), s6);
      s7 = _mm256_fmadd_ps(x3, _mm256_load_ps(bt + 56), s7);
    }
    for (; t < k; ++t) {
      const __m256 xv = _mm256_broadcast_ss(x + t);
      s0 = _mm256_fmadd_ps(xv, _mm256_load_ps(b + t * 16), s0);
      s1 = _mm256_fmadd_ps(xv, _mm256_load_ps(b + t * 16 + 8), s1);
    }
    __m256 lo = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s4, s6));
    __m256 hi = _mm256_add_ps(_mm256_add_ps(s1, s3), _mm256_add_ps(s5, s7));
    float* out = y + p * 16;
    if (load_y) {
      lo = _mm256_add_ps(lo, _mm256_loadu_ps(out));
      hi = _mm256_add_ps(hi, _mm256_loadu_ps(out + 8));
    }
    _mm256_storeu_ps(out, lo);
    _mm256_storeu_ps(out + 8, hi);
  }
}

}  // namespace

const KernelTable& avx2_kernels() {
  static const KernelTable table = {
      "avx2-fma",
      {nullptr, &tile_avx2<1>, &tile_avx2<2>, &tile_avx2<3>, &tile_avx2<4>, &tile_avx2<5>,
       &tile_avx2<6>},
      &gemv_avx2};
  return table;
}
#else
// Non-x86 or non-GNU compilers: no AVX2 kernels; the dispatcher never selects this table.
const KernelTable& avx2_kernels() { return generic_kernels(); }
#endif

}  // namespace kvr::cpu::detail
