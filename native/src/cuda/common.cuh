// Device helpers shared by the CUDA kernels: warp reductions, element loads that widen bf16/f16/f32
// to f32 exactly, and the KV element type traits. Device code only (included by .cu files);
// the math that must match the CPU bit for bit is in common/device_math.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_math.h"

namespace kvr::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// KV cache element types: the storage type and its exact widening / nearest-even narrowing.
struct KvF32 {
  using T = float;
  static __device__ __forceinline__ float load(const T* p) { return *p; }
  static __device__ __forceinline__ T store(float x) { return x; }
};
struct KvBF16 {
  using T = uint16_t;
  static __device__ __forceinline__ float load(const T* p) { return dm::bf16_to_f32(*p); }
  static __device__ __forceinline__ T store(float x) { return dm::f32_to_bf16(x); }
};
struct KvF16 {
  using T = uint16_t;
  static __device__ __forceinline__ float load(const T* p) { return dm::f16_to_f32(*p); }
  static __device__ __forceinline__ T store(float x) { return dm::f32_to_f16(x); }
};

// Widens the two bf16 halves of a 32-bit word (low half first in memory).
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

}  // namespace kvr::cuda
