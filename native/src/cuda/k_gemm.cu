// Prefill projection fallback when cuBLASLt is absent: C = A·Wᵀ (+bias)(+C) on tensor cores with
// mma.sync m16n8k16 (bf16 in, f32 accumulate; sm_80 and sm_90a). A is f32 (activations) and is
// split into bf16 hi + lo in shared memory, two MMAs per fragment, so the product keeps ~16
// mantissa bits of A; a bf16 W is exact, an f32 W is split too (third MMA, hi·lo). Block tile
// 64×64×32, 4 warps as 2×2 of 32×32. Plain (not pipelined) tile loads: a correct baseline, not
// the fastest GEMM (docs/cuda.md).
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace kvr::cuda {
namespace {

using dm::kGemmBK;
using dm::kGemmBM;
using dm::kGemmBN;
constexpr uint32_t kPad = 8;                // bf16 elements of row padding: conflict-free fragments
constexpr uint32_t kLd = kGemmBK + kPad;    // smem row length in bf16

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t ld32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

template <bool W_BF16>
__global__ void __launch_bounds__(128) gemm_kernel(const float* __restrict__ a, size_t lda, uint32_t m,
                                                   const void* __restrict__ wp, uint32_t n, uint32_t k,
                                                   const float* __restrict__ bias, float* c, size_t ldc,
                                                   bool accumulate) {
  __shared__ __align__(16) uint16_t a_hi[kGemmBM][kLd];
  __shared__ __align__(16) uint16_t a_lo[kGemmBM][kLd];
  __shared__ __align__(16) uint16_t w_hi[kGemmBN][kLd];
  __shared__ __align__(16) uint16_t w_lo[W_BF16 ? 1 : kGemmBN][kLd];

  const uint32_t tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const uint32_t gq = lane >> 2, tq = lane & 3;  // mma fragment group / thread-in-group
  const uint32_t m0 = blockIdx.y * kGemmBM, n0 = blockIdx.x * kGemmBN;
  const uint32_t wm = (warp >> 1) * 32, wn = (warp & 1) * 32;

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  for (uint32_t k0 = 0; k0 < k; k0 += kGemmBK) {
    // A tile (64 × 32 f32): each thread 16 elements as 8 pairs; split into hi/lo.
#pragma unroll
    for (int it = 0; it < 8; ++it) {
      const uint32_t idx = it * 128 + tid;        // pair index in the tile: 64 rows × 16 pairs
      const uint32_t r = idx >> 4, cp = (idx & 15) * 2;
      const uint32_t gr = m0 + r, gk = k0 + cp;
      float v0 = 0.f, v1 = 0.f;
      if (gr < m) {
        const float* ap = a + static_cast<size_t>(gr) * lda + gk;
        if (gk < k) v0 = ap[0];
        if (gk + 1 < k) v1 = ap[1];
      }
      uint16_t h0, l0, h1, l1;
      dm::split_bf16(v0, &h0, &l0);
      dm::split_bf16(v1, &h1, &l1);
      *reinterpret_cast<uint32_t*>(&a_hi[r][cp]) = static_cast<uint32_t>(h0) | (static_cast<uint32_t>(h1) << 16);
      *reinterpret_cast<uint32_t*>(&a_lo[r][cp]) = static_cast<uint32_t>(l0) | (static_cast<uint32_t>(l1) << 16);
    }
    // W tile (64 rows of n × 32 k).
#pragma unroll
    for (int it = 0; it < 8; ++it) {
      const uint32_t idx = it * 128 + tid;
      const uint32_t r = idx >> 4, cp = (idx & 15) * 2;
      const uint32_t gn = n0 + r, gk = k0 + cp;
      uint16_t h0 = 0, h1 = 0, l0 = 0, l1 = 0;
      if (gn < n) {
        if (W_BF16) {
          const uint16_t* wr = static_cast<const uint16_t*>(wp) + static_cast<size_t>(gn) * k + gk;
          if (gk < k) h0 = wr[0];
          if (gk + 1 < k) h1 = wr[1];
        } else {
          const float* wr = static_cast<const float*>(wp) + static_cast<size_t>(gn) * k + gk;
          if (gk < k) dm::split_bf16(wr[0], &h0, &l0);
          if (gk + 1 < k) dm::split_bf16(wr[1], &h1, &l1);
        }
      }
      *reinterpret_cast<uint32_t*>(&w_hi[r][cp]) = static_cast<uint32_t>(h0) | (static_cast<uint32_t>(h1) << 16);
      if (!W_BF16)
        *reinterpret_cast<uint32_t*>(&w_lo[W_BF16 ? 0 : r][cp]) =
            static_cast<uint32_t>(l0) | (static_cast<uint32_t>(l1) << 16);
    }
    __syncthreads();

#pragma unroll
    for (uint32_t kk = 0; kk < kGemmBK; kk += 16) {
      uint32_t fa_hi[2][4], fa_lo[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t r = wm + i * 16 + gq;
        fa_hi[i][0] = ld32(&a_hi[r][kk + 2 * tq]);
        fa_hi[i][1] = ld32(&a_hi[r + 8][kk + 2 * tq]);
        fa_hi[i][2] = ld32(&a_hi[r][kk + 2 * tq + 8]);
        fa_hi[i][3] = ld32(&a_hi[r + 8][kk + 2 * tq + 8]);
        fa_lo[i][0] = ld32(&a_lo[r][kk + 2 * tq]);
        fa_lo[i][1] = ld32(&a_lo[r + 8][kk + 2 * tq]);
        fa_lo[i][2] = ld32(&a_lo[r][kk + 2 * tq + 8]);
        fa_lo[i][3] = ld32(&a_lo[r + 8][kk + 2 * tq + 8]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t cn = wn + j * 8 + gq;
        const uint32_t b0 = ld32(&w_hi[cn][kk + 2 * tq]), b1 = ld32(&w_hi[cn][kk + 2 * tq + 8]);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma_bf16(acc[i][j], fa_lo[i], b0, b1);  // small terms first
          mma_bf16(acc[i][j], fa_hi[i], b0, b1);
        }
        if (!W_BF16) {
          const uint32_t c0 = ld32(&w_lo[W_BF16 ? 0 : cn][kk + 2 * tq]);
          const uint32_t c1 = ld32(&w_lo[W_BF16 ? 0 : cn][kk + 2 * tq + 8]);
#pragma unroll
          for (int i = 0; i < 2; ++i) mma_bf16(acc[i][j], fa_hi[i], c0, c1);
        }
      }
    }
    __syncthreads();
  }

  // Epilogue: c0,c1 at (row gq, cols 2tq, 2tq+1), c2,c3 at row gq + 8.
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t row = m0 + wm + i * 16 + gq + (e >= 2 ? 8 : 0);
        const uint32_t col = n0 + wn + j * 8 + 2 * tq + (e & 1);
        if (row < m && col < n) {
          float v = acc[i][j][e];
          if (bias) v += bias[col];
          float* cp = c + static_cast<size_t>(row) * ldc + col;
          if (accumulate) v += *cp;
          *cp = v;
        }
      }
}

}  // namespace

cudaError_t launch_gemm(const float* a, size_t lda, uint32_t m, const DevMatrix& w, const float* bias, float* c,
                        size_t ldc, bool accumulate, cudaStream_t stream) {
  if (m == 0 || w.rows == 0) return cudaSuccess;
  const dm::GemmPlan p = dm::plan_gemm(m, w.rows, w.cols);
  const dim3 grid(p.grid_n, p.grid_m);
  if (w.bf16) {
    gemm_kernel<true><<<grid, 128, 0, stream>>>(a, lda, m, w.data, w.rows, w.cols, bias, c, ldc, accumulate);
  } else {
    gemm_kernel<false><<<grid, 128, 0, stream>>>(a, lda, m, w.data, w.rows, w.cols, bias, c, ldc, accumulate);
  }
  return cudaGetLastError();
}

}  // namespace kvr::cuda
