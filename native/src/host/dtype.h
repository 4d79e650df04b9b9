// Element types (kvr_dtype): byte sizes and scalar f32 <-> bf16/f16 conversions, round-to-
// nearest-even, NaN kept quiet (defined in common/device_math.h, shared with CUDA). Exact;
// vectorised bulk versions live in host/convert.h. Not a general half-float library (no arithmetic on halves).
#pragma once

#include <cstdint>
#include <cstring>

#include "common/device_math.h"
#include "kvrelay.h"

namespace kvr {

inline bool dtype_valid(uint32_t d) {
  return d == KVR_DTYPE_F32 || d == KVR_DTYPE_F16 || d == KVR_DTYPE_BF16;
}
inline size_t dtype_size(uint32_t d) { return d == KVR_DTYPE_F32 ? 4 : 2; }
inline const char* dtype_name(uint32_t d) {
  return d == KVR_DTYPE_F32 ? "f32" : d == KVR_DTYPE_F16 ? "f16" : d == KVR_DTYPE_BF16 ? "bf16" : "?";
}

// The scalar conversions are the ones the CUDA kernels use (common/device_math.h).
using dm::bf16_to_f32;
using dm::bits_f32;
using dm::f16_to_f32;
using dm::f32_bits;
using dm::f32_to_bf16;
using dm::f32_to_f16;

// Reads one element of type d at p (any alignment) as f32.
inline float load_as_f32(const void* p, uint32_t d) {
  if (d == KVR_DTYPE_F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return d == KVR_DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

}  // namespace kvr
