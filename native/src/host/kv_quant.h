// KV snapshot quantization kernels (q8 symmetric, q4 asymmetric group-wise) on f32 blocks laid
// out (heads, tokens, head_dim) row-major. Argument and length checks live in kv_codec.cpp;
// these kernels trust their shapes. Not the snapshot format itself (lib/snapshot owns that).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvr::cpu {

// Scale axis: per channel = one scale per (head, dim) over the block's tokens (keys);
// per token = one scale per (head, token) over head_dim (values).
enum class QuantAxis : uint32_t { PerChannel = 0, PerToken = 1 };

// True when every element of x (n) is finite.
bool all_finite(const float* x, size_t n);

// A scale below FLT_MIN is stored as 0 with codes 0 (the group is flushed: its spread is below
// 127·FLT_MIN resp. 15·FLT_MIN, so the error stays below that).
// q8: s = absmax / 127 per group, code = clamp(rint(x / s), -127, 127); s = 0 → codes 0.
// scales: (heads, head_dim) per channel or (heads, tokens) per token.
void quantize_q8(const float* x, size_t heads, size_t tokens, size_t dim, QuantAxis axis,
                 int8_t* codes, float* scales);
void dequantize_q8(const int8_t* codes, const float* scales, size_t heads, size_t tokens,
                   size_t dim, QuantAxis axis, float* out);

// q4: groups of `group` elements along tokens (per channel) or along head_dim (per token);
// per group m = min, s = (max - min) / 15, code = clamp(rint((x - m) / s), 0, 15) (s = 0 →
// code 0), two codes per byte, flat element 2i in the low nibble, odd tail nibble 0.
// scales, mins: (heads, ceil(tokens/group), dim) per channel; (heads, tokens, ceil(dim/group))
// per token.
void quantize_q4(const float* x, size_t heads, size_t tokens, size_t dim, QuantAxis axis,
                 size_t group, uint8_t* codes, float* scales, float* mins);
void dequantize_q4(const uint8_t* codes, const float* scales, const float* mins, size_t heads,
                   size_t tokens, size_t dim, QuantAxis axis, size_t group, float* out);

// CRC32C of data (len bytes) continuing from crc (0 to start); see kvr_crc32c.
uint32_t crc32c(const uint8_t* data, size_t len, uint32_t crc);

}  // namespace kvr::cpu
