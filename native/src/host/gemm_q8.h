// q8 weights (PackedWeight::pack_q8 in gemm.cpp, layout in gemm.h): the per-call activation
// quantizer (shared with q4 and the int8 GEMM), the matrix-vector kernels (AVX-512 VNNI /
// AVX-VNNI vpdpbusd, AVX2 vpmaddubsw, or portable integer loops, all with the same result bit for
// bit) and the dequantization of a panel slice (dequantize(), tied-embedding rows). Internal to
// the GEMM (gemm.cpp); not the driver.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvr::cpu {
class PackedWeight;
}

namespace kvr::cpu::q8 {

// x (k) f32 → signed codes (kq bytes, kq = blocks·32; q = rint(x/d) in [-127, 127], zero padding
// past k) and one scale d = absmax/127 per 32-block (0 for an all-zero block); when sums is not
// null, also Σ q per block (q8 weights: −128·Σq undoes their +128 offset; q4: dx·Σq meets the
// offsets m).
void quantize_x(const float* x, size_t k, size_t blocks, int8_t* codes, float* scales,
                int32_t* sums = nullptr);

// y columns of panels [p0, p1) (+)= x · Wᵀ with x quantized by quantize_x and xoff[b] = −128·Σq
// of block b: per output, per block the exact int32 dot Σ q·(code − 128) (vpdpbusd of the
// unsigned weight codes and the signed activation codes, started at xoff), then
// acc = fma(dx·d, dot, acc) over blocks in k order (d the bf16 weight scale, widened), then
// y = acc (or y + acc). Same bits on every kernel and for any panel split.
void gemv(const PackedWeight& w, const int8_t* xq, const float* dx, const int32_t* xoff, size_t p0,
          size_t p1, float* y, bool accumulate);

// dst (kc, 16) f32 k-major = dequantized rows [pc, pc+kc) of panel p (pc a multiple of 32):
// d·(code − 128), exact in f32.
void dequant_slice(const PackedWeight& w, size_t p, size_t pc, size_t kc, float* dst);

// "avx512-vnni", "avx-vnni", "avx2" or "generic".
const char* kernel_name();

}  // namespace kvr::cpu::q8
