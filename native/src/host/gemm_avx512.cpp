// AVX-512F micro-kernels for the packed GEMM: the AVX2 kernels (gemm_avx2.cpp) with one 16-lane
// zmm register per panel row instead of two ymm halves — a 6x16 tile is 6 zmm accumulators, a
// GEMV step is one FMA per panel — and bf16 panels widened exactly in registers. Every output
// still accumulates its products in k order in one lane with FMA, then adds C once: the results
// are bit-identical to the AVX2 kernels (lib/native/gemm_avx512_test.ts). The tall tiles (16 rows
// of A per micro-panel, gemm_kernels.h) are the same kernel with a 16-row A stride. Compiled per function
// with target attributes; the driver calls these only when cpu_features.h says AVX-512F.
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "host/gemm_kernels.h"

#if defined(__GNUC__) && defined(__x86_64__)
#define KVR_AVX512_TARGET __attribute__((target("avx512f,avx2,fma")))
#define KVR_HAVE_AVX512_KERNELS 1
#else
#define KVR_HAVE_AVX512_KERNELS 0
#endif

namespace kvr::cpu::detail {

#if KVR_HAVE_AVX512_KERNELS
namespace {

// 16 consecutive panel elements as f32: f32 as is, bf16 widened exactly (zero-extend, << 16).
KVR_AVX512_TARGET inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
KVR_AVX512_TARGET inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  // maskz forms: GCC 12's plain ones pass an undefined vector that -Wmaybe-uninitialized rejects
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16));
}

// c (MR, 16) (+)= a (kc, AR)[:, :MR] · b (kc, 16); see TileFn / TileBf16Fn (AR = 6) and the tall
// tiles (AR = 16) of KernelTable.
template <int MR, typename T, int AR = static_cast<int>(kTileRows)>
KVR_AVX512_TARGET void tile_avx512(size_t kc, const float* a, const T* b, float* c, size_t ldc,
                                   bool load_c) {
  __m512 acc[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    if (load_c) _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    acc[r] = _mm512_setzero_ps();
  }
#pragma GCC unroll 4
  for (size_t t = 0; t < kc; ++t) {
    const __m512 bv = load16(b);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r]), bv, acc[r]);
    a += AR;
    b += 16;
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    float* row = c + r * ldc;
    if (load_c) acc[r] = _mm512_add_ps(acc[r], _mm512_loadu_ps(row));
    _mm512_storeu_ps(row, acc[r]);
  }
}

// y (16 * NP) (+)= x (kc) · NP panels; NP independent accumulator chains.
template <int NP, typename T>
KVR_AVX512_TARGET inline void gemv_group(size_t kc, const float* x, const T* b, size_t panel_stride,
                                         float* y, bool load_y) {
  __m512 acc[NP];
#pragma GCC unroll 8
  for (int q = 0; q < NP; ++q) acc[q] = _mm512_setzero_ps();
  for (size_t t = 0; t < kc; ++t) {
    const __m512 xv = _mm512_set1_ps(x[t]);
#pragma GCC unroll 8
    for (int q = 0; q < NP; ++q) acc[q] = _mm512_fmadd_ps(xv, load16(b + q * panel_stride + t * 16), acc[q]);
  }
#pragma GCC unroll 8
  for (int q = 0; q < NP; ++q) {
    float* out = y + q * 16;
    if (load_y) acc[q] = _mm512_add_ps(acc[q], _mm512_loadu_ps(out));
    _mm512_storeu_ps(out, acc[q]);
  }
}

// See GemvFn / GemvBf16Fn: eight panels at a time (8 chains hide the FMA latency), then four,
// then one by one.
template <typename T>
KVR_AVX512_TARGET void gemv_avx512(size_t kc, const float* x, const T* b, size_t panel_stride,
                                   size_t n_panels, float* y, bool load_y) {
  size_t q = 0;
  for (; q + 8 <= n_panels; q += 8) gemv_group<8>(kc, x, b + q * panel_stride, panel_stride, y + q * 16, load_y);
  for (; q + 4 <= n_panels; q += 4) gemv_group<4>(kc, x, b + q * panel_stride, panel_stride, y + q * 16, load_y);
  for (; q < n_panels; ++q) gemv_group<1>(kc, x, b + q * panel_stride, panel_stride, y + q * 16, load_y);
}

// See WidenBf16Fn: 16 elements per iteration, scalar tail.
KVR_AVX512_TARGET void widen_bf16_avx512(size_t count, const uint16_t* src, float* dst) {
  size_t i = 0;
  for (; i + 16 <= count; i += 16) _mm512_storeu_ps(dst + i, load16(src + i));
  for (; i < count; ++i) {
    const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    __builtin_memcpy(dst + i, &u, sizeof(u));
  }
}

// See KernelTable::pack_tall: 16 columns of the (up to) 16 rows at a time, transposed in registers
// (unpack 32-bit pairs, then 64-bit pairs, then 128-bit lanes twice); the column tail one by one.
KVR_AVX512_TARGET void pack_tall_avx512(const float* x, size_t ldx, size_t mc, size_t kc, float* dst) {
  size_t t = 0;
  for (; t + 16 <= kc; t += 16) {
    __m512 r[16];
#pragma GCC unroll 16
    for (size_t i = 0; i < 16; ++i) r[i] = i < mc ? _mm512_loadu_ps(x + i * ldx + t) : _mm512_setzero_ps();
    __m512 a[16], b[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {  // per 128-bit lane: (r2i[0], r2i+1[0], r2i[1], r2i+1[1]), ...
      a[2 * i] = _mm512_maskz_unpacklo_ps(0xFFFF, r[2 * i], r[2 * i + 1]);
      a[2 * i + 1] = _mm512_maskz_unpackhi_ps(0xFFFF, r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {  // per lane: element j of rows 4i..4i+3
      const __m512d a0 = _mm512_castps_pd(a[4 * i]), a1 = _mm512_castps_pd(a[4 * i + 1]);
      const __m512d a2 = _mm512_castps_pd(a[4 * i + 2]), a3 = _mm512_castps_pd(a[4 * i + 3]);
      b[4 * i] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, a0, a2));
      b[4 * i + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, a0, a2));
      b[4 * i + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, a1, a3));
      b[4 * i + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, a1, a3));
    }
    // b[4i + j] lane L holds column 4L + j of rows 4i..4i+3. Gather the four row groups per
    // column: lanes of b[j] (rows 0-3), b[4 + j] (4-7), b[8 + j], b[12 + j].
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      // c0: (g0 L0, g0 L1, g1 L0, g1 L1), c1: (g0 L2, g0 L3, g1 L2, g1 L3); likewise groups 2, 3
      const __m512 c0 = _mm512_maskz_shuffle_f32x4(0xFFFF, b[j], b[4 + j], 0x44);
      const __m512 c1 = _mm512_maskz_shuffle_f32x4(0xFFFF, b[j], b[4 + j], 0xEE);
      const __m512 c2 = _mm512_maskz_shuffle_f32x4(0xFFFF, b[8 + j], b[12 + j], 0x44);
      const __m512 c3 = _mm512_maskz_shuffle_f32x4(0xFFFF, b[8 + j], b[12 + j], 0xEE);
      // column 4L + j = (g0 L, g1 L, g2 L, g3 L)
      _mm512_storeu_ps(dst + (t + j) * 16, _mm512_maskz_shuffle_f32x4(0xFFFF, c0, c2, 0x88));
      _mm512_storeu_ps(dst + (t + 4 + j) * 16, _mm512_maskz_shuffle_f32x4(0xFFFF, c0, c2, 0xDD));
      _mm512_storeu_ps(dst + (t + 8 + j) * 16, _mm512_maskz_shuffle_f32x4(0xFFFF, c1, c3, 0x88));
      _mm512_storeu_ps(dst + (t + 12 + j) * 16, _mm512_maskz_shuffle_f32x4(0xFFFF, c1, c3, 0xDD));
    }
  }
  for (; t < kc; ++t)
    for (size_t i = 0; i < 16; ++i) dst[t * 16 + i] = i < mc ? x[i * ldx + t] : 0.f;
}

}  // namespace

// table[mr] = tile_avx512<mr, T, Stride> for mr = 1..sizeof...(R); table[0] stays null.
template <class T, size_t Stride, class Fn, size_t N, size_t... R>
void fill_tiles(Fn (&table)[N], std::index_sequence<R...>) {
  static_assert(sizeof...(R) + 1 == N, "one kernel per row count");
  ((table[R + 1] = &tile_avx512<static_cast<int>(R + 1), T, static_cast<int>(Stride)>), ...);
}

const KernelTable& avx512_kernels() {
  static const KernelTable table = [] {
    KernelTable t{};
    t.name = "avx512";
    fill_tiles<float, kTileRows>(t.tile, std::make_index_sequence<kTileRows>());
    fill_tiles<uint16_t, kTileRows>(t.tile_bf16, std::make_index_sequence<kTileRows>());
    t.gemv = &gemv_avx512<float>;
    t.gemv_bf16 = &gemv_avx512<uint16_t>;
    t.widen_bf16 = &widen_bf16_avx512;
    fill_tiles<float, kTallRows>(t.tall, std::make_index_sequence<kTallRows>());
    fill_tiles<uint16_t, kTallRows>(t.tall_bf16, std::make_index_sequence<kTallRows>());
    t.pack_tall = &pack_tall_avx512;
    return t;
  }();
  return table;
}
#else
// Non-x86-64 or non-GNU compilers: no AVX-512 kernels; the dispatcher never selects this table.
const KernelTable& avx512_kernels() { return generic_kernels(); }
#endif

}  // namespace kvr::cpu::detail
