// What a snapshot import accepts as a KV value: finite, at most kKvMaxAbs in magnitude, and
// finite once rounded to the cache's type (f32 1e5 overflows an f16 cache). The exact per-element
// rule (value_fault), the message naming a refused element, and the fast whole-block forms the
// host import runs (chunk_codec.cpp): a magnitude-bits scan for lossless blocks and a bound from
// the stored scales for q8/q4. Not the frame layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvr {

// The largest |K| or |V| an import accepts, 2^24 (docs/snapshot-format.md "KV value bound"):
// with it an attention output is at most 2^24 per element (a convex combination of V rows), the
// o_proj of up to 2^14 of them with weights up to 2^8 stays below 2^46, and the next RMSNorm's
// sum of 2^14 squares below 2^106 < FLT_MAX; a score q·k over head_dim <= 2^8 stays finite for
// any |q| < 2^96. So a finite model cannot turn an accepted cache into non-finite attention or
// logits, while real models' K/V (|x| < 2^12) keep a 4096x margin. Every finite f16 (<= 65504)
// is within it. Scalar constexpr: CUDA device code reads it too (cuda/codec.cu).
constexpr float kKvMaxAbs = 16777216.0f;

// "" when x is accepted by a cache of cache_dtype, else the reason: "not finite", "out of range"
// (|x| > kKvMaxAbs) or "overflow" (infinite once rounded to cache_dtype).
const char* value_fault(float x, uint32_t cache_dtype);

// The message of a refused element of chunk `chunk`'s layer `layer` K (or V) block, shaped
// (kv_heads, tokens, head_dim): names the head, the absolute token position (start + token) and
// the dim, the value and why. Shared by the host import and the CUDA import (cuda/codec_host.cpp).
std::string value_fault_message(float x, uint32_t cache_dtype, uint32_t chunk, size_t layer, bool is_v,
                                size_t element, size_t tokens, size_t head_dim, uint32_t start);

// The smallest sign-cleared bit pattern of an `encoding` element (f32: 31 bits, bf16/f16: 15
// bits) whose value value_fault refuses for cache_dtype. Refusal is monotone in magnitude (a
// sign-magnitude format orders magnitudes like its bits; NaN patterns sit above infinity), so it
// is found by bisection over value_fault itself rather than written down twice.
uint32_t fault_bits(uint32_t encoding, uint32_t cache_dtype);

// True when all n elements of the lossless block p (encoding f32/bf16/f16, any alignment) have
// magnitude bits below `limit` (fault_bits(encoding, cache_dtype)): every value is accepted.
bool block_accepted(const uint8_t* p, size_t n, uint32_t encoding, uint32_t limit);

// The largest magnitude value_fault accepts for cache_dtype (f32: FLT_MAX; bf16: just below the
// first value that rounds to infinity; f16: just below 65520). A dequantized value whose bound
// stays under it (with rounding margin) needs no per-element check.
double accepted_magnitude(uint32_t cache_dtype);

}  // namespace kvr
