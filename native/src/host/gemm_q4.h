// q4 weights (PackedWeight::pack_q4, layout in gemm.h): the load-time quantizer's per-block fit,
// the matrix-vector kernels (AVX-512 VNNI / AVX-VNNI vpdpbusd, AVX2 vpmaddubsw, or portable
// integer loops, all with the same result bit for bit) and the dequantization of a panel slice
// for the f32 tile GEMM (m > 1). Internal to the GEMM (gemm.cpp); not the driver. The activation
// quantizer is q8's (gemm_q8.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvr::cpu {
class PackedWeight;
}

namespace kvr::cpu::q4 {

// Fits one block v[0..n) (n ≤ 32): codes c[i] in [0, 15] and f16 d, m with v ≈ d·c + m,
// minimising the squared error of the dequantized values (min/max start, then least-squares
// refits of d and m given the codes, each kept only when it lowers the error).
void fit_block(const float* v, size_t n, uint8_t* codes, uint16_t* d16, uint16_t* m16);

// y columns of panels [p0, p1) (+)= x · Wᵀ with x quantized by q8::quantize_x: xs the signed
// codes (code − 128), dx the block scales, dxs[b] = dx[b]·Σ xs of block b. Per output and block
// the exact int32 dot Σ c·xs, then acc = fma(dx·d, dot, acc), acc = fma(dxs, m, acc) over blocks
// in k order; y = acc (or y + acc). Same bits on every kernel and for any panel split.
void gemv(const PackedWeight& w, const int8_t* xs, const float* dx, const float* dxs, size_t p0,
          size_t p1, float* y, bool accumulate);

// dst (kc, 16) f32 k-major = dequantized rows [pc, pc+kc) of panel p (pc a multiple of 32):
// d·c + m in f32.
void dequant_slice(const PackedWeight& w, size_t p, size_t pc, size_t kc, float* dst);

// "avx512-vnni", "avx-vnni", "avx2" or "generic".
const char* kernel_name();

}  // namespace kvr::cpu::q4
