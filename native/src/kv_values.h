// What a snapshot import accepts as a KV value: finite, and finite once rounded to the cache's
// type (f32 1e38 overflows an f16 cache). The exact per-element rule (value_fault) and the fast
// whole-block forms the host import runs (chunk_codec.cpp): a magnitude-bits scan for lossless
// blocks and a bound from the stored scales for q8/q4. Not the frame layout nor the messages.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvr {

// "" when x is accepted by a cache of cache_dtype, else the reason: "not finite" or "overflow".
const char* value_fault(float x, uint32_t cache_dtype);

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
