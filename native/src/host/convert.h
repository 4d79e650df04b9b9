// Bulk conversions between f32 and the cache/weight dtypes, vectorised with F16C/AVX2 when the
// CPU has them (same bits as the scalar versions in dtype.h: round-to-nearest-even).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvr::cpu {

// dst[i] = src[i] as f32 for n elements of dtype (any alignment of src).
void to_f32(const void* src, uint32_t dtype, float* dst, size_t n);
// dst[i] = src[i] rounded to dtype (nearest-even) for n elements.
void from_f32(const float* src, uint32_t dtype, void* dst, size_t n);

}  // namespace kvr::cpu
