// q8 weights (PackedWeight::pack_q8, layout in gemm.h): the load-time quantizer, the per-call
// activation quantizer (shared with q4), the matrix-vector kernels (AVX-512 VNNI / AVX-VNNI
// vpdpbusd, AVX2 vpmaddubsw, or portable integer loops, all with the same result bit for bit) and the dequantization of a panel slice for the f32
// tile GEMM (m > 1). Internal to the GEMM (gemm.cpp); not the driver.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvr::cpu {
class PackedWeight;
}

namespace kvr::cpu::q8 {

// x (k) f32 → codes (kq bytes, kq = blocks·32; code = q + 128 with q = rint(x/d) in [-127, 127],
// zero padding past k) and one scale d = absmax/127 per 32-block (0 for an all-zero block); when
// sums is not null, also Σ q per block (the q4 kernels need it for the weights' offsets m).
void quantize_x(const float* x, size_t k, size_t blocks, uint8_t* codes, float* scales,
                int32_t* sums = nullptr);

// y columns of panels [p0, p1) (+)= x · Wᵀ with x quantized by quantize_x: per output, per block
// the exact int32 dot of the codes, then acc = fma(dx·dw, dot, acc) over blocks in k order, then
// y = acc (or y + acc). Same bits on every kernel and for any panel split.
void gemv(const PackedWeight& w, const uint8_t* xq, const float* dx, size_t p0, size_t p1, float* y,
          bool accumulate);

// dst (kc, 16) f32 k-major = dequantized rows [pc, pc+kc) of panel p (pc a multiple of 32).
void dequant_slice(const PackedWeight& w, size_t p, size_t pc, size_t kc, float* dst);

// "avx512-vnni", "avx-vnni", "avx2" or "generic".
const char* kernel_name();

}  // namespace kvr::cpu::q8
