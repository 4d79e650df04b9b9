// Portable kernels for q8/q4 KV quantization (see kv_quant.h for the exact rules). Plain loops
// the compiler vectorises at -O3; no allocation, no exceptions. Not the ABI checks (kv_codec.cpp).
#include "host/kv_quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace kvr::cpu {

bool all_finite(const float* x, size_t n) {
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok &= std::fabs(x[i]) <= FLT_MAX;  // false for NaN and ±inf
  return ok;
}

namespace {

// Round to nearest even for |v| < 2^22 (codes are within ±128 here) with plain SSE2 adds, so the
// loops vectorise on baseline x86-64 (std::rint would not). Same result as rint in that range.
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

// A scale below FLT_MIN is stored as 0 (the group's spread is < 127·FLT_MIN resp. 15·FLT_MIN:
// flushed), so 1/s never overflows; inv = 0 then gives code 0.
inline float scale_or_zero(float s) { return s >= FLT_MIN ? s : 0.0f; }
inline float inverse(float s) { return s > 0.0f ? 1.0f / s : 0.0f; }

inline int8_t q8_code(float x, float inv) {
  const float r = round_even(x * inv);
  return static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
}

inline uint8_t q4_code(float x, float m, float inv) {
  const float r = round_even((x - m) * inv);
  return static_cast<uint8_t>(std::min(15.0f, std::max(0.0f, r)));
}

inline void put_nibble(uint8_t* codes, size_t i, uint8_t c) {
  uint8_t& b = codes[i >> 1];
  b = (i & 1) ? static_cast<uint8_t>((b & 0x0f) | (c << 4)) : static_cast<uint8_t>((b & 0xf0) | c);
}

inline uint8_t get_nibble(const uint8_t* codes, size_t i) {
  return (i & 1) ? static_cast<uint8_t>(codes[i >> 1] >> 4) : static_cast<uint8_t>(codes[i >> 1] & 0x0f);
}

}  // namespace

void quantize_q8(const float* x, size_t heads, size_t tokens, size_t dim, QuantAxis axis,
                 int8_t* codes, float* scales) {
  if (axis == QuantAxis::PerChannel) {
    for (size_t h = 0; h < heads; ++h) {
      float* s = scales + h * dim;  // (dim)
      std::fill(s, s + dim, 0.0f);
      const float* xh = x + h * tokens * dim;
      for (size_t t = 0; t < tokens; ++t)
        for (size_t d = 0; d < dim; ++d) s[d] = std::max(s[d], std::fabs(xh[t * dim + d]));
      for (size_t d = 0; d < dim; ++d) s[d] = scale_or_zero(s[d] / 127.0f);
      int8_t* ch = codes + h * tokens * dim;
      constexpr size_t kBlock = 256;
      float inv[kBlock];  // inverse scales of a block of channels (no allocation)
      for (size_t d0 = 0; d0 < dim; d0 += kBlock) {
        const size_t nb = std::min(kBlock, dim - d0);
        for (size_t j = 0; j < nb; ++j) inv[j] = inverse(s[d0 + j]);
        for (size_t t = 0; t < tokens; ++t)
          for (size_t j = 0; j < nb; ++j) ch[t * dim + d0 + j] = q8_code(xh[t * dim + d0 + j], inv[j]);
      }
    }
    return;
  }
  for (size_t r = 0; r < heads * tokens; ++r) {
    const float* xr = x + r * dim;
    float amax = 0.0f;
    for (size_t d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(xr[d]));
    const float s = scale_or_zero(amax / 127.0f);
    scales[r] = s;
    const float inv = inverse(s);
    for (size_t d = 0; d < dim; ++d) codes[r * dim + d] = q8_code(xr[d], inv);
  }
}

void dequantize_q8(const int8_t* codes, const float* scales, size_t heads, size_t tokens,
                   size_t dim, QuantAxis axis, float* out) {
  if (axis == QuantAxis::PerChannel) {
    for (size_t h = 0; h < heads; ++h) {
      const float* s = scales + h * dim;
      for (size_t t = 0; t < tokens; ++t) {
        const size_t base = (h * tokens + t) * dim;
        for (size_t d = 0; d < dim; ++d) out[base + d] = static_cast<float>(codes[base + d]) * s[d];
      }
    }
    return;
  }
  for (size_t r = 0; r < heads * tokens; ++r) {
    const float s = scales[r];
    for (size_t d = 0; d < dim; ++d) out[r * dim + d] = static_cast<float>(codes[r * dim + d]) * s;
  }
}

void quantize_q4(const float* x, size_t heads, size_t tokens, size_t dim, QuantAxis axis,
                 size_t group, uint8_t* codes, float* scales, float* mins) {
  if (axis == QuantAxis::PerChannel) {
    const size_t ng = (tokens + group - 1) / group;
    for (size_t h = 0; h < heads; ++h) {
      for (size_t g = 0; g < ng; ++g) {
        const size_t t0 = g * group, t1 = std::min(tokens, t0 + group);
        float* s = scales + (h * ng + g) * dim;  // (dim): min/max over the group's tokens
        float* m = mins + (h * ng + g) * dim;
        std::copy(x + (h * tokens + t0) * dim, x + (h * tokens + t0 + 1) * dim, m);
        std::copy(m, m + dim, s);  // s holds the running max until the division below
        for (size_t t = t0 + 1; t < t1; ++t) {
          const float* xr = x + (h * tokens + t) * dim;
          for (size_t d = 0; d < dim; ++d) {
            m[d] = std::min(m[d], xr[d]);
            s[d] = std::max(s[d], xr[d]);
          }
        }
        for (size_t d = 0; d < dim; ++d) s[d] = scale_or_zero((s[d] - m[d]) / 15.0f);
        constexpr size_t kBlock = 256;
        float inv[kBlock];
        for (size_t d0 = 0; d0 < dim; d0 += kBlock) {
          const size_t nb = std::min(kBlock, dim - d0);
          for (size_t j = 0; j < nb; ++j) inv[j] = inverse(s[d0 + j]);
          for (size_t t = t0; t < t1; ++t) {
            const size_t base = (h * tokens + t) * dim + d0;
            for (size_t j = 0; j < nb; ++j)
              put_nibble(codes, base + j, q4_code(x[base + j], m[d0 + j], inv[j]));
          }
        }
      }
    }
  } else {
    const size_t ng = (dim + group - 1) / group;
    for (size_t r = 0; r < heads * tokens; ++r) {
      for (size_t g = 0; g < ng; ++g) {
        const size_t d0 = g * group, d1 = std::min(dim, d0 + group);
        const float* xr = x + r * dim;
        float lo = xr[d0], hi = lo;
        for (size_t d = d0 + 1; d < d1; ++d) {
          lo = std::min(lo, xr[d]);
          hi = std::max(hi, xr[d]);
        }
        const float s = scale_or_zero((hi - lo) / 15.0f);
        scales[r * ng + g] = s;
        mins[r * ng + g] = lo;
        const float inv = inverse(s);
        for (size_t d = d0; d < d1; ++d) put_nibble(codes, r * dim + d, q4_code(xr[d], lo, inv));
      }
    }
  }
  const size_t n = heads * tokens * dim;
  if (n & 1) codes[n >> 1] &= 0x0f;  // odd tail: high nibble of the last byte is 0
}

void dequantize_q4(const uint8_t* codes, const float* scales, const float* mins, size_t heads,
                   size_t tokens, size_t dim, QuantAxis axis, size_t group, float* out) {
  if (axis == QuantAxis::PerChannel) {
    const size_t ng = (tokens + group - 1) / group;
    for (size_t h = 0; h < heads; ++h)
      for (size_t t = 0; t < tokens; ++t) {
        const size_t g = t / group;
        const float* s = scales + (h * ng + g) * dim;
        const float* m = mins + (h * ng + g) * dim;
        const size_t base = (h * tokens + t) * dim;
        for (size_t d = 0; d < dim; ++d)
          out[base + d] = m[d] + static_cast<float>(get_nibble(codes, base + d)) * s[d];
      }
    return;
  }
  const size_t ng = (dim + group - 1) / group;
  for (size_t r = 0; r < heads * tokens; ++r)
    for (size_t d = 0; d < dim; ++d) {
      const size_t g = r * ng + d / group;
      out[r * dim + d] = mins[g] + static_cast<float>(get_nibble(codes, r * dim + d)) * scales[g];
    }
}

}  // namespace kvr::cpu
