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

// y (16 * NP) (+)= x (kc) · NP panels; 2 * NP independent accumulator chains.
template <int NP>
KVR_AVX2_TARGET inline void gemv_group(size_t kc, const float* x, const float* b,
                                       size_t panel_stride, float* y, bool load_y) {
  __m256 acc[NP][2];
#pragma GCC unroll 4
  for (int q = 0; q < NP; ++q) acc[q][0] = acc[q][1] = _mm256_setzero_ps();
  for (size_t t = 0; t < kc; ++t) {
    const __m256 xv = _mm256_broadcast_ss(x + t);
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      const float* bt = b + q * panel_stride + t * 16;
      acc[q][0] = _mm256_fmadd_ps(xv, _mm256_load_ps(bt), acc[q][0]);
      acc[q][1] = _mm256_fmadd_ps(xv, _mm256_load_ps(bt + 8), acc[q][1]);
    }
  }
#pragma GCC unroll 4
  for (int q = 0; q < NP; ++q) {
    float* out = y + q * 16;
    if (load_y) {
      acc[q][0] = _mm256_add_ps(acc[q][0], _mm256_loadu_ps(out));
      acc[q][1] = _mm256_add_ps(acc[q][1], _mm256_loadu_ps(out + 8));
    }
    _mm256_storeu_ps(out, acc[q][0]);
    _mm256_storeu_ps(out + 8, acc[q][1]);
  }
}

// See GemvFn: four panels at a time (8 chains hide the FMA latency), then the rest one by one.
KVR_AVX2_TARGET void gemv_avx2(size_t kc, const float* x, const float* b, size_t panel_stride,
                               size_t n_panels, float* y, bool load_y) {
  size_t q = 0;
  for (; q + 4 <= n_panels; q += 4) {
    gemv_group<4>(kc, x, b + q * panel_stride, panel_stride, y + q * 16, load_y);
  }
  for (; q < n_panels; ++q) {
    gemv_group<1>(kc, x, b + q * panel_stride, panel_stride, y + q * 16, load_y);
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
