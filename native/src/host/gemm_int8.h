// The int8 GEMM for q8/q4 weights with more than one activation row (prefill chunks, batched
// steps): each row quantized once per call per 32-block as the decode GEMV does (gemm_q8.h
// quantize_x), then integer tiles (AVX-512 VNNI / AVX-VNNI; elsewhere the GEMV per row). Every
// output has the same bits as the one-row GEMV of its row. Not the f32/bf16 GEMM (gemm.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "host/gemm.h"

namespace kvr::cpu::int8 {

// Activation rows quantized for one weight format: per row kq = blocks·32 signed codes q in
// [-127, 127], dx (blocks scales) and per block, for q8, xoff = −128·Σq (undoes the weights'
// +128 offset) or, for q4, dxs = dx·Σq.
struct QuantRows {
  size_t m = 0, blocks = 0;
  bool q4 = false;
  std::vector<int8_t, AlignedAllocator<int8_t>> codes;  // (m, kq)
  std::vector<float> dx, dxs;                          // (m, blocks); dxs for q4
  std::vector<int32_t> xoff;                           // (m, blocks); q8
  // Sizes the buffers for m rows against w (q8 or q4). Throws std::bad_alloc.
  void prepare(size_t m_rows, const PackedWeight& w);
  // Quantizes rows [r0, r1) of x (row stride ldx, w.cols() values each) after prepare().
  void quantize(const float* x, size_t ldx, size_t k, size_t r0, size_t r1);
};

// y rows [r0, r1) × columns of panels [p0, p1) (+)= the quantized rows · Wᵀ, on the calling
// thread (q.m rows prepared for w; y row stride ldy).
void gemm_rect(const QuantRows& q, const PackedWeight& w, float* y, size_t ldy, bool accumulate,
               size_t r0, size_t r1, size_t p0, size_t p1);

// y (m, n) (+)= x (m, k) · Wᵀ for a q8/q4 W on n_threads threads from `workers`: rows quantized (split
// over the threads), then row blocks × panel ranges. Throws std::bad_alloc (buffers; y untouched).
void matmul(const float* x, size_t m, size_t ldx, const PackedWeight& w, float* y, size_t ldy,
            bool accumulate, size_t n_threads, Workers workers);

// "avx512-vnni", "avx-vnni" or "rows" (the q8/q4 GEMV kernel once per row).
const char* kernel_name();

}  // namespace kvr::cpu::int8
