// The import's KV value rule and its block forms (kv_values.h). The scans are plain loops over
// magnitude bits with no early exit, so the compiler vectorises them (SSE2 at the baseline).
#include "host/kv_values.h"

#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/errors.h"
#include "host/dtype.h"

namespace kvr {

const char* value_fault(float x, uint32_t cache_dtype) {
  if (!(std::fabs(x) <= FLT_MAX)) return "not finite";
  if (std::fabs(x) > kKvMaxAbs) return "out of range";
  if (cache_dtype == KVR_DTYPE_BF16 && (f32_to_bf16(x) & 0x7f80u) == 0x7f80u) return "overflow";
  if (cache_dtype == KVR_DTYPE_F16 && (f32_to_f16(x) & 0x7c00u) == 0x7c00u) return "overflow";
  return "";
}

std::string value_fault_message(float x, uint32_t cache_dtype, uint32_t chunk, size_t layer, bool is_v,
                                size_t element, size_t tokens, size_t head_dim, uint32_t start) {
  const char* fault = value_fault(x, cache_dtype);
  const size_t head = element / (tokens * head_dim), token = element / head_dim % tokens, dim = element % head_dim;
  const std::string where =
      format("chunk %u layer %zu %s, head %zu, token position %zu, dim %zu: value %g", chunk, layer, is_v ? "V" : "K",
             head, static_cast<size_t>(start) + token, dim, static_cast<double>(x));
  if (fault[0] == 'n') return where + " is not finite; KV values must be finite";
  if (fault[0] == 'o' && fault[1] == 'u')
    return where + format(" exceeds the KV magnitude bound %.0f (2^24)", static_cast<double>(kKvMaxAbs));
  return where + format(" overflows the %s cache", dtype_name(cache_dtype));
}

namespace {

float widen_bits(uint32_t bits, uint32_t encoding) {
  if (encoding == KVR_DTYPE_F32) return bits_f32(bits);
  const uint16_t h = static_cast<uint16_t>(bits);
  return encoding == KVR_DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

}  // namespace

uint32_t fault_bits(uint32_t encoding, uint32_t cache_dtype) {
  // Invariant: pattern lo is accepted (0 is), pattern hi is refused (the all-ones NaN is).
  uint32_t lo = 0, hi = encoding == KVR_DTYPE_F32 ? 0x7fffffffu : 0x7fffu;
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (value_fault(widen_bits(mid, encoding), cache_dtype)[0] != 0)
      hi = mid;
    else
      lo = mid;
  }
  return hi;
}

bool block_accepted(const uint8_t* p, size_t n, uint32_t encoding, uint32_t limit) {
  uint32_t bad = 0;
  if (encoding == KVR_DTYPE_F32) {
    for (size_t i = 0; i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      bad |= static_cast<uint32_t>((v & 0x7fffffffu) >= limit);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      bad |= static_cast<uint32_t>((v & 0x7fffu) >= limit);
    }
  }
  return bad == 0;
}

double accepted_magnitude(uint32_t cache_dtype) {
  return static_cast<double>(bits_f32(fault_bits(KVR_DTYPE_F32, cache_dtype) - 1));
}

}  // namespace kvr
