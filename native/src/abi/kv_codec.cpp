// C ABI of the KV snapshot codec: q8/q4 quantize/dequantize of one (heads, tokens, head_dim)
// block, and CRC32C. Checks every pointer, shape and length, then calls the kernels in
// host/kv_quant.cpp and host/crc32c.cpp.
// Not the snapshot container format (lib/snapshot) nor the KV cache read/write (sequence.cpp).
#include <cmath>
#include <cfloat>
#include <cstdint>

#include "core/errors.h"
#include "host/kv_quant.h"
#include "kvrelay.h"

namespace {

using kvr::fail;
using kvr::format;
using kvr::cpu::QuantAxis;

constexpr uint32_t kMaxGroup = 1024;

// Checks shape and axis and computes element count and per-block scale count; status or KVR_OK.
int32_t check_shape(const char* fn, uint32_t heads, uint32_t tokens, uint32_t dim, uint32_t axis,
                    size_t* n, size_t* n_scales) {
  if (heads == 0 || tokens == 0 || dim == 0)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: heads %u, tokens %u, head_dim %u must all be >= 1", fn, heads, tokens,
                       dim));
  if (axis != KVR_QUANT_PER_CHANNEL && axis != KVR_QUANT_PER_TOKEN)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: unknown axis %u", fn, axis));
  // u32 * u32 * u32 fits in 96 bits; check the 64-bit product does not wrap.
  const unsigned __int128 prod = static_cast<unsigned __int128>(heads) * tokens * dim;
  if (prod > (static_cast<unsigned __int128>(1) << 40))
    return fail(KVR_ERR_OUT_OF_RANGE,
                format("%s: block of %u x %u x %u elements exceeds 2^40", fn, heads, tokens, dim));
  *n = static_cast<size_t>(prod);
  *n_scales = axis == KVR_QUANT_PER_CHANNEL ? static_cast<size_t>(heads) * dim
                                            : static_cast<size_t>(heads) * tokens;
  return KVR_OK;
}

int32_t check_len(const char* fn, const char* what, const void* p, size_t len, size_t need) {
  if (p == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: %s is NULL", fn, what));
  if (len != need)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: %s length %zu, expected %zu", fn, what, len, need));
  return KVR_OK;
}

size_t q4_groups(uint32_t heads, uint32_t tokens, uint32_t dim, uint32_t axis, uint32_t group) {
  if (axis == KVR_QUANT_PER_CHANNEL)
    return static_cast<size_t>(heads) * ((tokens + group - 1) / group) * dim;
  return static_cast<size_t>(heads) * tokens * ((dim + group - 1) / group);
}

int32_t check_scales(const char* fn, const float* s, const float* m, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!(s[i] >= 0.0f && s[i] <= FLT_MAX))
      return fail(KVR_ERR_CORRUPT, format("%s: scale %zu is %g (must be finite and >= 0)", fn, i,
                                          static_cast<double>(s[i])));
    if (m != nullptr && !(std::fabs(m[i]) <= FLT_MAX))
      return fail(KVR_ERR_CORRUPT,
                  format("%s: min %zu is %g (must be finite)", fn, i, static_cast<double>(m[i])));
  }
  return KVR_OK;
}

#define KVR_TRY(expr)                   \
  do {                                  \
    const int32_t kvr_st_ = (expr);     \
    if (kvr_st_ != KVR_OK) return kvr_st_; \
  } while (0)

}  // namespace

extern "C" {

KVR_API int32_t kvr_kv_quantize_q8(const float* x, size_t x_len, uint32_t heads, uint32_t tokens,
                                   uint32_t head_dim, uint32_t axis, int8_t* codes,
                                   size_t codes_len, float* scales, size_t scales_len) {
  const char* fn = "kvr_kv_quantize_q8";
  size_t n = 0, ns = 0;
  KVR_TRY(check_shape(fn, heads, tokens, head_dim, axis, &n, &ns));
  KVR_TRY(check_len(fn, "x", x, x_len, n));
  KVR_TRY(check_len(fn, "codes", codes, codes_len, n));
  KVR_TRY(check_len(fn, "scales", scales, scales_len, ns));
  if (!kvr::cpu::all_finite(x, n))
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: input holds NaN or infinity", fn));
  kvr::cpu::quantize_q8(x, heads, tokens, head_dim, static_cast<QuantAxis>(axis), codes, scales);
  return KVR_OK;
}

KVR_API int32_t kvr_kv_dequantize_q8(const int8_t* codes, size_t codes_len, const float* scales,
                                     size_t scales_len, uint32_t heads, uint32_t tokens,
                                     uint32_t head_dim, uint32_t axis, float* out,
                                     size_t out_len) {
  const char* fn = "kvr_kv_dequantize_q8";
  size_t n = 0, ns = 0;
  KVR_TRY(check_shape(fn, heads, tokens, head_dim, axis, &n, &ns));
  KVR_TRY(check_len(fn, "codes", codes, codes_len, n));
  KVR_TRY(check_len(fn, "scales", scales, scales_len, ns));
  KVR_TRY(check_len(fn, "out", out, out_len, n));
  KVR_TRY(check_scales(fn, scales, nullptr, ns));
  kvr::cpu::dequantize_q8(codes, scales, heads, tokens, head_dim, static_cast<QuantAxis>(axis), out);
  return KVR_OK;
}

KVR_API int32_t kvr_kv_quantize_q4(const float* x, size_t x_len, uint32_t heads, uint32_t tokens,
                                   uint32_t head_dim, uint32_t axis, uint32_t group,
                                   uint8_t* codes, size_t codes_len, float* scales,
                                   size_t scales_len, float* mins, size_t mins_len) {
  const char* fn = "kvr_kv_quantize_q4";
  size_t n = 0, ns = 0;
  KVR_TRY(check_shape(fn, heads, tokens, head_dim, axis, &n, &ns));
  if (group == 0 || group > kMaxGroup)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: group %u outside [1, %u]", fn, group, kMaxGroup));
  const size_t ng = q4_groups(heads, tokens, head_dim, axis, group);
  KVR_TRY(check_len(fn, "x", x, x_len, n));
  KVR_TRY(check_len(fn, "codes", codes, codes_len, (n + 1) / 2));
  KVR_TRY(check_len(fn, "scales", scales, scales_len, ng));
  KVR_TRY(check_len(fn, "mins", mins, mins_len, ng));
  if (!kvr::cpu::all_finite(x, n))
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: input holds NaN or infinity", fn));
  kvr::cpu::quantize_q4(x, heads, tokens, head_dim, static_cast<QuantAxis>(axis), group, codes,
                        scales, mins);
  if (!kvr::cpu::all_finite(scales, ng))  // max - min overflowed f32 (values near ±FLT_MAX)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: a group's range max - min overflows f32", fn));
  return KVR_OK;
}

KVR_API int32_t kvr_kv_dequantize_q4(const uint8_t* codes, size_t codes_len, const float* scales,
                                     size_t scales_len, const float* mins, size_t mins_len,
                                     uint32_t heads, uint32_t tokens, uint32_t head_dim,
                                     uint32_t axis, uint32_t group, float* out, size_t out_len) {
  const char* fn = "kvr_kv_dequantize_q4";
  size_t n = 0, ns = 0;
  KVR_TRY(check_shape(fn, heads, tokens, head_dim, axis, &n, &ns));
  if (group == 0 || group > kMaxGroup)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: group %u outside [1, %u]", fn, group, kMaxGroup));
  const size_t ng = q4_groups(heads, tokens, head_dim, axis, group);
  KVR_TRY(check_len(fn, "codes", codes, codes_len, (n + 1) / 2));
  KVR_TRY(check_len(fn, "scales", scales, scales_len, ng));
  KVR_TRY(check_len(fn, "mins", mins, mins_len, ng));
  KVR_TRY(check_len(fn, "out", out, out_len, n));
  KVR_TRY(check_scales(fn, scales, mins, ng));
  kvr::cpu::dequantize_q4(codes, scales, mins, heads, tokens, head_dim, static_cast<QuantAxis>(axis),
                          group, out);
  return KVR_OK;
}

KVR_API int32_t kvr_crc32c(const uint8_t* data, size_t len, uint32_t crc, uint32_t* out) {
  if (out == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, "kvr_crc32c: out is NULL");
  if (data == nullptr && len != 0)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("kvr_crc32c: data is NULL with len %zu", len));
  *out = len == 0 ? crc : kvr::cpu::crc32c(data, len, crc);
  return KVR_OK;
}

}  // extern "C"
