// AVX2 + FMA micro-kernels for the packed GEMM: a 6x16 register tile (12 ymm accumulators), a
// one-row GEMV over whole f32 or bf16 panels, and the exact bf16 -> f32 panel widening. Compiled
// per function with target attributes (no -mavx2 for the translation unit), so the library still
// loads on CPUs without AVX2; the driver calls these only after checking the CPU (gemm.cpp).
#include <immintrin.h>

#include <cstdint>

#include "host/gemm_kernels.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define KVR_AVX2_TARGET __attribute__((target("avx2,fma")))
#define KVR_HAVE_AVX2_KERNELS 1
#else
#define KVR_HAVE_AVX2_KERNELS 0
#endif

namespace kvr::cpu::detail {

#if KVR_HAVE_AVX2_KERNELS
namespace {

// 8 consecutive panel elements as f32: f32 loaded as is, bf16 widened exactly (zero-extend to
// 32 bits, shift into the upper half), so both give the same lanes for the same values.
KVR_AVX2_TARGET inline __m256 load8(const float* p) { return _mm256_load_ps(p); }
KVR_AVX2_TARGET inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// c (MR, 16) (+)= a (kc, 6)[:, :MR] · b (kc, 16) with b f32 or bf16; see TileFn / TileBf16Fn.
template <int MR, typename T>
KVR_AVX2_TARGET void tile_avx2(size_t kc, const float* a, const T* b, float* c, size_t ldc,
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
    const __m256 b0 = load8(b);
    const __m256 b1 = load8(b + 8);
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

// y (16 * NP) (+)= x (kc) · NP panels of element type T; 2 * NP independent accumulator chains.
template <int NP, typename T>
KVR_AVX2_TARGET inline void gemv_group(size_t kc, const float* x, const T* b,
                                       size_t panel_stride, float* y, bool load_y) {
  __m256 acc[NP][2];
#pragma GCC unroll 4
  for (int q = 0; q < NP; ++q) acc[q][0] = acc[q][1] = _mm256_setzero_ps();
  for (size_t t = 0; t < kc; ++t) {
    const __m256 xv = _mm256_broadcast_ss(x + t);
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      const T* bt = b + q * panel_stride + t * 16;
      acc[q][0] = _mm256_fmadd_ps(xv, load8(bt), acc[q][0]);
      acc[q][1] = _mm256_fmadd_ps(xv, load8(bt + 8), acc[q][1]);
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

// See GemvFn / GemvBf16Fn: four panels at a time (8 chains hide the FMA latency), then the rest
// one by one.
template <typename T>
KVR_AVX2_TARGET void gemv_avx2(size_t kc, const float* x, const T* b, size_t panel_stride,
                               size_t n_panels, float* y, bool load_y) {
  size_t q = 0;
  for (; q + 4 <= n_panels; q += 4) {
    gemv_group<4>(kc, x, b + q * panel_stride, panel_stride, y + q * 16, load_y);
  }
  for (; q < n_panels; ++q) {
    gemv_group<1>(kc, x, b + q * panel_stride, panel_stride, y + q * 16, load_y);
  }
}

// See WidenBf16Fn: 16 elements per iteration, scalar tail.
KVR_AVX2_TARGET void widen_bf16_avx2(size_t count, const uint16_t* src, float* dst) {
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    _mm256_storeu_ps(dst + i, load8(src + i));
    _mm256_storeu_ps(dst + i + 8, load8(src + i + 8));
  }
  for (; i < count; ++i) {
    const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    __builtin_memcpy(dst + i, &u, sizeof(u));
  }
}

}  // namespace

const KernelTable& avx2_kernels() {
  static const KernelTable table = {
      "avx2-fma",
      {nullptr, &tile_avx2<1, float>, &tile_avx2<2, float>, &tile_avx2<3, float>,
       &tile_avx2<4, float>, &tile_avx2<5, float>, &tile_avx2<6, float>},
      {nullptr, &tile_avx2<1, uint16_t>, &tile_avx2<2, uint16_t>, &tile_avx2<3, uint16_t>,
       &tile_avx2<4, uint16_t>, &tile_avx2<5, uint16_t>, &tile_avx2<6, uint16_t>},
      &gemv_avx2<float>,
      &gemv_avx2<uint16_t>,
      &widen_bf16_avx2,
      {},  // no tall tiles: A in 6-row micro-panels
      {},
      nullptr};
  return table;
}
#else
// Non-x86 or non-GNU compilers: no AVX2 kernels; the dispatcher never selects this table.
const KernelTable& avx2_kernels() { return generic_kernels(); }
#endif

}  // namespace kvr::cpu::detail
