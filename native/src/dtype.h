// Element types (kvr_dtype): byte sizes and scalar f32 <-> bf16/f16 conversions, round-to-
// nearest-even, NaN kept quiet. Bit-level and exact; vectorised bulk versions live in
// cpu/convert.h. Not a general half-float library (no arithmetic on halves).
#pragma once

#include <cstdint>
#include <cstring>

#include "kvrelay.h"

namespace kvr {

inline bool dtype_valid(uint32_t d) {
  return d == KVR_DTYPE_F32 || d == KVR_DTYPE_F16 || d == KVR_DTYPE_BF16;
}
inline size_t dtype_size(uint32_t d) { return d == KVR_DTYPE_F32 ? 4 : 2; }
inline const char* dtype_name(uint32_t d) {
  return d == KVR_DTYPE_F32 ? "f32" : d == KVR_DTYPE_F16 ? "f16" : d == KVR_DTYPE_BF16 ? "bf16" : "?";
}

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return bits_f32(f32_bits(v) | sign);
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));  // NaN made quiet, as F16C
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// Same results as F16C vcvtps2ph with round-to-nearest-even (F. Giesen's float_to_half_rtne).
inline uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN (NaN: quiet, top payload bits kept)
    return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? (0x200u | ((ax >> 13) & 0x3ffu)) : 0u));
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (ax < 0x38800000u) {  // result is subnormal or zero: let the FPU round at 2^-24
    const float r = bits_f32(ax) + 0.5f;
    return static_cast<uint16_t>(sign | (f32_bits(r) - 0x3f000000u));
  }
  const uint32_t odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + odd;  // rebias exponent (15 - 127) << 23, plus rounding bias
  return static_cast<uint16_t>(sign | (ax >> 13));
}

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
