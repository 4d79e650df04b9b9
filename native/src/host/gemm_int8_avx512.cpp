// AVX-512 VNNI tiles of the int8 GEMM (gemm_int8_kernels.h): up to 6 activation rows × 2 weight
// panels (32 columns) per call, vpdpbusd over whole 32-blocks with every weight load shared by
// the rows and every activation broadcast shared by the panels, then the GEMV's f32 epilogue per
// block. Integer sums are exact in any order, so each output has the same bits as the q8/q4 GEMV
// (gemm_q8.cpp / gemm_q4.cpp). Compiled per function with target attributes.
#include <cstring>

#include "host/gemm_int8_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVR_INT8_AVX512 1
#define KVR_TARGET_VNNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))
#else
#define KVR_INT8_AVX512 0
#endif

namespace kvr::cpu::int8::detail {

#if KVR_INT8_AVX512
namespace {

constexpr int kQ8Rows = 6;  // 12 int32 + 12 f32 accumulators + 2 weight vectors of 32 zmm
constexpr int kQ4Rows = 4;  // q4 also keeps 2 nibble vectors per panel live

// 4 activation code bytes broadcast to every int32 lane.
KVR_TARGET_VNNI512 inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// int32 → f32, exact (|dot| < 2^24); maskz form as in gemm_q8.cpp (GCC 12 -Werror).
KVR_TARGET_VNNI512 inline __m512 to_f32(__m512i v) { return _mm512_maskz_cvtepi32_ps(0xFFFF, v); }

// 16 bf16 scales → f32 (as gemm_q8.cpp).
KVR_TARGET_VNNI512 inline __m512 scales16(const uint16_t* s) {
  const __m512i w = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, w, 16));
}

// q8: s = −128·Σq + Σ q·(w+128) per block (vpdpbusd: unsigned weight code, signed activation
// code; the start value is per row and block, shared by every column), then
// acc = fma(dx·d, s, acc) as gemm_q8.cpp's gemv_avx512.
template <int R, int P>
KVR_TARGET_VNNI512 void q8_tile(size_t blocks, const XRows& x, const uint8_t* codes, const uint16_t* scale,
                                float* out) {
  const size_t cs = blocks * 512, ms = blocks * 16;
  __m512 acc[R][P];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    __m512i s[R][P];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512i off = _mm512_set1_epi32(x.xoff[r * x.ldd + b]);
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) s[r][p] = off;
    }
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      __m512i wv[P];
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) wv[p] = _mm512_load_si512(codes + p * cs + b * 512 + g * 64);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const __m512i xb = bcast4(x.codes + r * x.ld + b * 32 + g * 4);
#pragma GCC unroll 2
        for (int p = 0; p < P; ++p) s[r][p] = _mm512_dpbusd_epi32(s[r][p], wv[p], xb);
      }
    }
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) {
      const __m512 sc = scales16(scale + p * ms + b * 16);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const __m512 d = _mm512_mul_ps(_mm512_set1_ps(x.dx[r * x.ldd + b]), sc);
        acc[r][p] = _mm512_fmadd_ps(d, to_f32(s[r][p]), acc[r][p]);
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(out + r * kTileCols + p * 16, acc[r][p]);
}

// q4: s = Σ c·q per block (vpdpbusd: unsigned nibble c, signed activation q; low nibbles hold
// k = 4j+e, high nibbles k = 16+4j+e), then acc = fma(dx·d, s, acc), acc = fma(dx·Σq, m, acc) as
// gemm_q4.cpp's gemv_avx512.
template <int R, int P>
KVR_TARGET_VNNI512 void q4_tile(size_t blocks, const XRows& x, const uint8_t* codes, const uint16_t* scale,
                                const uint16_t* mins, float* out) {
  const size_t cs = blocks * 256, ms = blocks * 16;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc[R][P];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    __m512i s[R][P];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) s[r][p] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      __m512i lo[P], hi[P];
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) {
        const __m512i v = _mm512_load_si512(codes + p * cs + b * 256 + j * 64);
        lo[p] = _mm512_and_si512(v, m4);
        hi[p] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      }
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = x.codes + r * x.ld + b * 32;
        const __m512i xl = bcast4(xr + j * 4), xh = bcast4(xr + 16 + j * 4);
#pragma GCC unroll 2
        for (int p = 0; p < P; ++p) {
          s[r][p] = _mm512_dpbusd_epi32(s[r][p], lo[p], xl);
          s[r][p] = _mm512_dpbusd_epi32(s[r][p], hi[p], xh);
        }
      }
    }
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) {
      const __m512 d = _mm512_maskz_cvtph_ps(
          0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale + p * ms + b * 16)));
      const __m512 m = _mm512_maskz_cvtph_ps(
          0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mins + p * ms + b * 16)));
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const __m512 a = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(x.dx[r * x.ldd + b]), d),
                                         to_f32(s[r][p]), acc[r][p]);
        acc[r][p] = _mm512_fmadd_ps(_mm512_set1_ps(x.dxs[r * x.ldd + b]), m, a);
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(out + r * kTileCols + p * 16, acc[r][p]);
}

// Runtime (rows, np) → template instance.
template <int R>
KVR_TARGET_VNNI512 void q8_rows(size_t rows, size_t np, size_t blocks, const XRows& x, const uint8_t* codes,
                                const uint16_t* scale, float* out) {
  if constexpr (R > 1) {
    if (rows < static_cast<size_t>(R)) return q8_rows<R - 1>(rows, np, blocks, x, codes, scale, out);
  }
  if (np == 2) return q8_tile<R, 2>(blocks, x, codes, scale, out);
  q8_tile<R, 1>(blocks, x, codes, scale, out);
}

template <int R>
KVR_TARGET_VNNI512 void q4_rows(size_t rows, size_t np, size_t blocks, const XRows& x, const uint8_t* codes,
                                const uint16_t* scale, const uint16_t* mins, float* out) {
  if constexpr (R > 1) {
    if (rows < static_cast<size_t>(R)) return q4_rows<R - 1>(rows, np, blocks, x, codes, scale, mins, out);
  }
  if (np == 2) return q4_tile<R, 2>(blocks, x, codes, scale, mins, out);
  q4_tile<R, 1>(blocks, x, codes, scale, mins, out);
}

void q8_entry(size_t rows, size_t np, size_t blocks, const XRows& x, const uint8_t* codes, const uint16_t* scale,
              float* out) {
  q8_rows<kQ8Rows>(rows, np, blocks, x, codes, scale, out);
}

void q4_entry(size_t rows, size_t np, size_t blocks, const XRows& x, const uint8_t* codes,
              const uint16_t* scale, const uint16_t* mins, float* out) {
  q4_rows<kQ4Rows>(rows, np, blocks, x, codes, scale, mins, out);
}

}  // namespace

const TileKernels& avx512_vnni_tiles() {
  static const TileKernels t{"avx512-vnni", kQ8Rows, kQ4Rows, &q8_entry, &q4_entry};
  return t;
}
#else
const TileKernels& avx512_vnni_tiles() {
  static const TileKernels t{"none", 0, 0, nullptr, nullptr};
  return t;
}
#endif

}  // namespace kvr::cpu::int8::detail
