// Bulk f32 <-> bf16/f16 conversions with an F16C/AVX2 path chosen at run time; bit-identical to
// the scalar conversions in dtype.h. Used by the KV cache write, attention tiles and KV read/write.
#include "host/convert.h"

#include <cstring>

#include "host/dtype.h"
#include "host/simd.h"

#if KVR_X86
#include <immintrin.h>
#endif

namespace kvr::cpu {
namespace {

void to_f32_scalar(const uint8_t* s, uint32_t dtype, float* dst, size_t i, size_t n) {
  if (dtype == KVR_DTYPE_F32) {
    std::memcpy(dst + i, s + 4 * i, 4 * (n - i));
    return;
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, s + 2 * i, 2);
    dst[i] = dtype == KVR_DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
}

void from_f32_scalar(const float* src, uint32_t dtype, uint8_t* d, size_t i, size_t n) {
  if (dtype == KVR_DTYPE_F32) {
    std::memcpy(d + 4 * i, src + i, 4 * (n - i));
    return;
  }
  for (; i < n; ++i) {
    const uint16_t h = dtype == KVR_DTYPE_BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
    std::memcpy(d + 2 * i, &h, 2);
  }
}

#if KVR_X86
KVR_TARGET_AVX2 size_t to_f32_avx2(const uint8_t* s, uint32_t dtype, float* dst, size_t n) {
  size_t i = 0;
  if (dtype == KVR_DTYPE_BF16) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
      const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
    }
  } else if (dtype == KVR_DTYPE_F16) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
  }
  return i;
}

KVR_TARGET_AVX2 size_t from_f32_avx2(const float* src, uint32_t dtype, uint8_t* d, size_t n) {
  size_t i = 0;
  if (dtype == KVR_DTYPE_F16) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * i), h);
    }
  }
  return i;
}
#endif

}  // namespace

void to_f32(const void* src, uint32_t dtype, float* dst, size_t n) {
  const uint8_t* s = static_cast<const uint8_t*>(src);
  size_t i = 0;
#if KVR_X86
  if (dtype != KVR_DTYPE_F32 && simd::has_avx2()) i = to_f32_avx2(s, dtype, dst, n);
#endif
  to_f32_scalar(s, dtype, dst, i, n);
}

void from_f32(const float* src, uint32_t dtype, void* dst, size_t n) {
  uint8_t* d = static_cast<uint8_t*>(dst);
  size_t i = 0;
#if KVR_X86
  if (dtype == KVR_DTYPE_F16 && simd::has_avx2()) i = from_f32_avx2(src, dtype, d, n);
#endif
  from_f32_scalar(src, dtype, d, i, n);
}

}  // namespace kvr::cpu
