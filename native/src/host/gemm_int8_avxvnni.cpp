// AVX-VNNI tiles of the int8 GEMM (gemm_int8_kernels.h) for CPUs with VEX vpdpbusd on ymm but
// without AVX-512 (Alder Lake-like): one panel (two 8-column ymm halves) × up to 3 (q8) or 2 (q4)
// activation rows per step — what 16 ymm registers hold — each weight load shared by the rows.
// The same exact int32 block dots and f32 epilogue as the GEMV (gemm_q8.cpp / gemm_q4.cpp's
// gemv_avxvnni), so the same bits. Compiled per function with target attributes.
#include <cstring>

#include "host/gemm_int8_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVR_INT8_AVXVNNI 1
#define KVR_TARGET_VNNI256 __attribute__((target("avx2,fma,f16c,avxvnni")))
#else
#define KVR_INT8_AVXVNNI 0
#endif

namespace kvr::cpu::int8::detail {

#if KVR_INT8_AVXVNNI
namespace {

constexpr int kQ8Rows = 3;
constexpr int kQ4Rows = 2;

KVR_TARGET_VNNI256 inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

KVR_TARGET_VNNI256 inline __m256i load256(const void* p) {
  return _mm256_load_si256(static_cast<const __m256i*>(p));
}

// One panel: out rows [0, R), 16 columns at out + r·kTileCols.
// 8 bf16 scales → f32 (as gemm_q8.cpp).
KVR_TARGET_VNNI256 inline __m256 scales8(const uint16_t* s) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// q8: unsigned weight codes × signed activation codes, each row's block sum started at its
// −128·Σq (gemm_q8.cpp's gemv_avxvnni).
template <int R>
KVR_TARGET_VNNI256 void q8_panel(size_t blocks, const XRows& x, const uint8_t* codes, const uint16_t* scale,
                                 float* out) {
  __m256 acc[R][2];
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    __m256i s[R][2];
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = _mm256_set1_epi32(x.xoff[r * x.ldd + b]);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m256i w0 = load256(codes + b * 512 + g * 64), w1 = load256(codes + b * 512 + g * 64 + 32);
#pragma GCC unroll 3
      for (int r = 0; r < R; ++r) {
        const __m256i xb = bcast4(x.codes + r * x.ld + b * 32 + g * 4);
        s[r][0] = _mm256_dpbusd_avx_epi32(s[r][0], w0, xb);
        s[r][1] = _mm256_dpbusd_avx_epi32(s[r][1], w1, xb);
      }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256 sc = scales8(scale + b * 16 + h * 8);
#pragma GCC unroll 3
      for (int r = 0; r < R; ++r) {
        const __m256 d = _mm256_mul_ps(_mm256_set1_ps(x.dx[r * x.ldd + b]), sc);
        acc[r][h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s[r][h]), acc[r][h]);
      }
    }
  }
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out + r * kTileCols, acc[r][0]);
    _mm256_storeu_ps(out + r * kTileCols + 8, acc[r][1]);
  }
}

template <int R>
KVR_TARGET_VNNI256 void q4_panel(size_t blocks, const XRows& x, const uint8_t* codes, const uint16_t* scale,
                                 const uint16_t* mins, float* out) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc[R][2];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    __m256i s[R][2];
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i v = load256(codes + b * 256 + j * 64 + h * 32);
        const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) {
          const int8_t* xr = x.codes + r * x.ld + b * 32;
          s[r][h] = _mm256_dpbusd_avx_epi32(s[r][h], lo, bcast4(xr + j * 4));
          s[r][h] = _mm256_dpbusd_avx_epi32(s[r][h], hi, bcast4(xr + 16 + j * 4));
        }
      }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scale + b * 16 + h * 8)));
      const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mins + b * 16 + h * 8)));
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) {
        const __m256 a = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(x.dx[r * x.ldd + b]), d),
                                         _mm256_cvtepi32_ps(s[r][h]), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(x.dxs[r * x.ldd + b]), m, a);
      }
    }
  }
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out + r * kTileCols, acc[r][0]);
    _mm256_storeu_ps(out + r * kTileCols + 8, acc[r][1]);
  }
}

void q8_entry(size_t rows, size_t np, size_t blocks, const XRows& x, const uint8_t* codes, const uint16_t* scale,
              float* out) {
  for (size_t p = 0; p < np; ++p) {
    const uint8_t* c = codes + p * blocks * 512;
    const uint16_t* s = scale + p * blocks * 16;
    float* o = out + p * 16;
    if (rows == 3) q8_panel<3>(blocks, x, c, s, o);
    else if (rows == 2) q8_panel<2>(blocks, x, c, s, o);
    else q8_panel<1>(blocks, x, c, s, o);
  }
}

void q4_entry(size_t rows, size_t np, size_t blocks, const XRows& x, const uint8_t* codes,
              const uint16_t* scale, const uint16_t* mins, float* out) {
  for (size_t p = 0; p < np; ++p) {
    const uint8_t* c = codes + p * blocks * 256;
    const uint16_t* s = scale + p * blocks * 16;
    const uint16_t* m = mins + p * blocks * 16;
    float* o = out + p * 16;
    if (rows == 2) q4_panel<2>(blocks, x, c, s, m, o);
    else q4_panel<1>(blocks, x, c, s, m, o);
  }
}

}  // namespace

const TileKernels& avx_vnni_tiles() {
  static const TileKernels t{"avx-vnni", kQ8Rows, kQ4Rows, &q8_entry, &q4_entry};
  return t;
}
#else
const TileKernels& avx_vnni_tiles() {
  static const TileKernels t{"none", 0, 0, nullptr, nullptr};
  return t;
}
#endif

}  // namespace kvr::cpu::int8::detail
