// Decode projections: y = W·x for one token, memory-bound. Each warp streams kGemvRowsPerWarp
// weight rows with 16-byte loads (8 bf16 or 4 f32 per lane per step, widened exactly), f32
// accumulation, x read through the read-only cache; bias and the residual add fused in the
// epilogue, and optionally the RMSNorm of x in the prologue (decode: one launch instead of two).
// Plan: common/device_math.h plan_gemv. Not for more than one token (k_gemm.cu).
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace kvr::cuda {
namespace {

using dm::kGemvRowsPerWarp;
using dm::kGemvWarps;

__device__ __forceinline__ float dot8_bf16(uint4 w, float4 x0, float4 x1, float acc) {
  acc = fmaf(bf16_lo(w.x), x0.x, acc);
  acc = fmaf(bf16_hi(w.x), x0.y, acc);
  acc = fmaf(bf16_lo(w.y), x0.z, acc);
  acc = fmaf(bf16_hi(w.y), x0.w, acc);
  acc = fmaf(bf16_lo(w.z), x1.x, acc);
  acc = fmaf(bf16_hi(w.z), x1.y, acc);
  acc = fmaf(bf16_lo(w.w), x1.z, acc);
  acc = fmaf(bf16_hi(w.w), x1.w, acc);
  return acc;
}

// x as the product sees it: x itself, or RMSNorm(x)·w (the CPU's order: (x·r)·w).
template <bool NORM>
struct XIn {
  const float* x;
  const float* nw;  // norm weight (k), NORM only
  float r;          // 1/sqrt(mean(x²) + eps), NORM only
  __device__ __forceinline__ float at(uint32_t i) const {
    return NORM ? dm::fmul(dm::fmul(__ldg(x + i), r), __ldg(nw + i)) : __ldg(x + i);
  }
  __device__ __forceinline__ float4 at4(uint32_t i) const {  // i % 4 == 0, 16-byte aligned
    float4 v = __ldg(reinterpret_cast<const float4*>(x + i));
    if (NORM) {
      const float4 w = __ldg(reinterpret_cast<const float4*>(nw + i));
      v.x = dm::fmul(dm::fmul(v.x, r), w.x);
      v.y = dm::fmul(dm::fmul(v.y, r), w.y);
      v.z = dm::fmul(dm::fmul(v.z, r), w.z);
      v.w = dm::fmul(dm::fmul(v.w, r), w.w);
    }
    return v;
  }
};

template <bool BF16, bool VEC, bool NORM>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(const void* __restrict__ wp, uint32_t n_rows,
                                                                uint32_t k, const float* __restrict__ x,
                                                                const float* __restrict__ norm_w, float eps,
                                                                const float* __restrict__ bias, float* y,
                                                                bool accumulate) {
  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t row0 = (blockIdx.x * kGemvWarps + warp) * kGemvRowsPerWarp;
  if (row0 >= n_rows) return;
  XIn<NORM> xin{x, norm_w, 1.f};
  if (NORM) {  // each warp reduces x itself (x is small and stays in L1): no separate launch
    double ss = 0.0;
    for (uint32_t i = lane; i < k; i += 32) {
      const float v = __ldg(x + i);
      ss += static_cast<double>(v) * v;
    }
    ss = warp_sum(ss);
    xin.r = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(k) + static_cast<double>(eps)));
  }
  float acc[kGemvRowsPerWarp];
#pragma unroll
  for (uint32_t r = 0; r < kGemvRowsPerWarp; ++r) acc[r] = 0.f;

  if (VEC) {
    constexpr uint32_t kPer = BF16 ? 8 : 4;  // elements per 16-byte load
    // Two steps in flight per iteration: 2 × kGemvRowsPerWarp independent 16-byte loads per lane.
    for (uint32_t base = lane * kPer; base < k; base += 64 * kPer) {
      const uint32_t k1 = base + 32 * kPer;
      const bool has1 = k1 < k;
      uint4 w0[kGemvRowsPerWarp], w1[kGemvRowsPerWarp];
#pragma unroll
      for (uint32_t r = 0; r < kGemvRowsPerWarp; ++r) {
        const uint32_t row = min(row0 + r, n_rows - 1);
        const char* rp = static_cast<const char*>(wp) + static_cast<size_t>(row) * k * (BF16 ? 2 : 4);
        w0[r] = __ldg(reinterpret_cast<const uint4*>(rp) + base / kPer);
        w1[r] = has1 ? __ldg(reinterpret_cast<const uint4*>(rp) + k1 / kPer) : make_uint4(0, 0, 0, 0);
      }
      if (BF16) {
        const float4 xa = xin.at4(base), xb = xin.at4(base + 4);
        float4 xc = make_float4(0, 0, 0, 0), xd = xc;
        if (has1) xc = xin.at4(k1), xd = xin.at4(k1 + 4);
#pragma unroll
        for (uint32_t r = 0; r < kGemvRowsPerWarp; ++r) {
          acc[r] = dot8_bf16(w0[r], xa, xb, acc[r]);
          acc[r] = dot8_bf16(w1[r], xc, xd, acc[r]);
        }
      } else {
        const float4 xa = xin.at4(base);
        const float4 xc = has1 ? xin.at4(k1) : make_float4(0, 0, 0, 0);
#pragma unroll
        for (uint32_t r = 0; r < kGemvRowsPerWarp; ++r) {
          acc[r] = fmaf(__uint_as_float(w0[r].x), xa.x, acc[r]);
          acc[r] = fmaf(__uint_as_float(w0[r].y), xa.y, acc[r]);
          acc[r] = fmaf(__uint_as_float(w0[r].z), xa.z, acc[r]);
          acc[r] = fmaf(__uint_as_float(w0[r].w), xa.w, acc[r]);
          acc[r] = fmaf(__uint_as_float(w1[r].x), xc.x, acc[r]);
          acc[r] = fmaf(__uint_as_float(w1[r].y), xc.y, acc[r]);
          acc[r] = fmaf(__uint_as_float(w1[r].z), xc.z, acc[r]);
          acc[r] = fmaf(__uint_as_float(w1[r].w), xc.w, acc[r]);
        }
      }
    }
  } else {
    for (uint32_t kk = lane; kk < k; kk += 32) {
      const float xv = xin.at(kk);
#pragma unroll
      for (uint32_t r = 0; r < kGemvRowsPerWarp; ++r) {
        const size_t row = min(row0 + r, n_rows - 1);
        const float wv = BF16 ? dm::bf16_to_f32(__ldg(static_cast<const uint16_t*>(wp) + row * k + kk))
                              : __ldg(static_cast<const float*>(wp) + row * k + kk);
        acc[r] = fmaf(wv, xv, acc[r]);
      }
    }
  }

#pragma unroll
  for (uint32_t r = 0; r < kGemvRowsPerWarp; ++r) {
    const float s = warp_sum(acc[r]);
    const uint32_t row = row0 + r;
    if (lane == 0 && row < n_rows) {
      float v = s;
      if (bias) v += bias[row];
      if (accumulate) v += y[row];
      y[row] = v;
    }
  }
}

template <bool BF16, bool NORM>
cudaError_t launch_typed(const DevMatrix& w, const float* x, const float* norm_w, float eps, const float* bias,
                         float* y, bool accumulate, cudaStream_t stream) {
  const dm::GemvPlan p = dm::plan_gemv(w.rows, w.cols, BF16 ? 2 : 4);
  // 16-byte loads also need 16-byte aligned rows, x and norm weight (cudaMalloc'd buffers,
  // offsets of whole rows).
  const bool aligned = (reinterpret_cast<uintptr_t>(w.data) % 16 == 0) && (reinterpret_cast<uintptr_t>(x) % 16 == 0) &&
                       (reinterpret_cast<uintptr_t>(norm_w) % 16 == 0);
  if (p.vector && aligned) {
    gemv_kernel<BF16, true, NORM>
        <<<p.blocks, p.threads, 0, stream>>>(w.data, w.rows, w.cols, x, norm_w, eps, bias, y, accumulate);
  } else {
    gemv_kernel<BF16, false, NORM>
        <<<p.blocks, p.threads, 0, stream>>>(w.data, w.rows, w.cols, x, norm_w, eps, bias, y, accumulate);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gemv(const DevMatrix& w, const float* x, const float* bias, float* y, bool accumulate,
                        cudaStream_t stream) {
  if (w.rows == 0) return cudaSuccess;
  return w.bf16 ? launch_typed<true, false>(w, x, nullptr, 0.f, bias, y, accumulate, stream)
                : launch_typed<false, false>(w, x, nullptr, 0.f, bias, y, accumulate, stream);
}

cudaError_t launch_norm_gemv(const DevMatrix& w, const float* x, const float* norm_w, float eps, const float* bias,
                             float* y, bool accumulate, cudaStream_t stream) {
  if (w.rows == 0) return cudaSuccess;
  return w.bf16 ? launch_typed<true, true>(w, x, norm_w, eps, bias, y, accumulate, stream)
                : launch_typed<false, true>(w, x, norm_w, eps, bias, y, accumulate, stream);
}

}  // namespace kvr::cuda
