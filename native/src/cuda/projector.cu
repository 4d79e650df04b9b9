// KV projection between two device caches (docs/gpu-handoff.md): gather every source layer of a
// token range into feature rows with the keys de-rotated by the source RoPE, and scatter target
// feature rows into the target cache with the keys rotated by the target RoPE (nearest-even to
// the cache dtype). The GEMM between them is the backend's (launch_gemm). Arithmetic follows
// host/projection_kernels.cpp: de-rotation in double (a·c + b·s, b·c − a·s), rotation in f32; cos/sin are
// the engine's (dm::rope_cos_sin, f32). Not the orchestration (projector_host.cpp).
#include <cstdint>

#include "common/device_math.h"
#include "cuda/common.cuh"
#include "cuda/handoff.h"

namespace kvr::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ size_t plane_offset(const DevKv& kv, size_t layer, int part) {
  return (2 * layer + part) * kv.heads * kv.capacity * kv.dim * (kv.kv_dtype == 0 ? 4 : 2);
}

__device__ __forceinline__ float load_kv(const DevKv& kv, size_t layer, int part, size_t i) {
  const uint8_t* p = kv.base + plane_offset(kv, layer, part);
  if (kv.kv_dtype == 0) return reinterpret_cast<const float*>(p)[i];
  const uint16_t h = reinterpret_cast<const uint16_t*>(p)[i];
  return kv.kv_dtype == 2 ? dm::bf16_to_f32(h) : dm::f16_to_f32(h);
}

__device__ __forceinline__ void store_kv(const DevKv& kv, size_t layer, int part, size_t i, float x) {
  uint8_t* p = kv.base + plane_offset(kv, layer, part);
  if (kv.kv_dtype == 0) reinterpret_cast<float*>(p)[i] = x;
  else reinterpret_cast<uint16_t*>(p)[i] = kv.kv_dtype == 2 ? dm::f32_to_bf16(x) : dm::f32_to_f16(x);
}

// One thread per (token, layer, head, pair i < dim/2): writes feature columns i and i + dim/2.
__global__ void gather_features(DevKv src, const double* inv_freq, uint32_t p0, uint32_t n, float* k_feat,
                                float* v_feat) {
  const size_t half = src.dim / 2, width = src.layers * src.heads * src.dim;
  const size_t total = static_cast<size_t>(n) * src.layers * src.heads * half;
  for (size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t i = idx % half, lh = (idx / half) % (src.layers * src.heads), t = idx / (half * src.layers * src.heads);
    const size_t l = lh / src.heads, h = lh % src.heads;
    const size_t pos = p0 + t;
    const size_t base = (h * src.capacity + (pos - src.first)) * src.dim;
    const size_t col = t * width + lh * src.dim;
    const float ka = load_kv(src, l, 0, base + i), kb = load_kv(src, l, 0, base + i + half);
    // cos/sin from the engine's fixed sincos (no local-memory argument reduction), rounded to f32:
    // the CPU de-rotates with glibc's double values; the difference is below f32 rounding of the
    // product in all but rare cases, and within the check's 1e-4 bound always.
    float cf, sf;
    dm::rope_cos_sin(static_cast<uint32_t>(pos), inv_freq[i], &cf, &sf);
    const double a = ka, b = kb, c = cf, s = sf;
    k_feat[col + i] = static_cast<float>(dm::dadd(dm::dmul(a, c), dm::dmul(b, s)));
    k_feat[col + i + half] = static_cast<float>(dm::dsub(dm::dmul(b, c), dm::dmul(a, s)));
    v_feat[col + i] = load_kv(src, l, 1, base + i);
    v_feat[col + i + half] = load_kv(src, l, 1, base + i + half);
  }
}

__global__ void scatter_features(DevKv dst, const double* inv_freq, uint32_t p0, uint32_t n, const float* k_feat,
                                 const float* v_feat) {
  const size_t half = dst.dim / 2, width = dst.layers * dst.heads * dst.dim;
  const size_t total = static_cast<size_t>(n) * dst.layers * dst.heads * half;
  for (size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t i = idx % half, lh = (idx / half) % (dst.layers * dst.heads), t = idx / (half * dst.layers * dst.heads);
    const size_t l = lh / dst.heads, h = lh % dst.heads;
    const size_t pos = p0 + t;
    const size_t base = (h * dst.capacity + (pos - dst.first)) * dst.dim;
    const size_t col = t * width + lh * dst.dim;
    float c, s;
    dm::rope_cos_sin(static_cast<uint32_t>(pos), inv_freq[i], &c, &s);
    const float a = k_feat[col + i], b = k_feat[col + i + half];
    store_kv(dst, l, 0, base + i, dm::fsub(dm::fmul(a, c), dm::fmul(b, s)));
    store_kv(dst, l, 0, base + i + half, dm::fadd(dm::fmul(b, c), dm::fmul(a, s)));
    store_kv(dst, l, 1, base + i, v_feat[col + i]);
    store_kv(dst, l, 1, base + i + half, v_feat[col + i + half]);
  }
}

unsigned grid_for(size_t items) {
  const size_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks < 65535u * 16u ? blocks : 65535u * 16u));
}

}  // namespace

cudaError_t launch_gather_features(const DevKv& src, const double* inv_freq, uint32_t p0, uint32_t n, float* k_feat,
                                   float* v_feat, cudaStream_t stream) {
  gather_features<<<grid_for(static_cast<size_t>(n) * src.layers * src.heads * (src.dim / 2)), kThreads, 0,
                    stream>>>(src, inv_freq, p0, n, k_feat, v_feat);
  return cudaGetLastError();
}

cudaError_t launch_scatter_features(const DevKv& dst, const double* inv_freq, uint32_t p0, uint32_t n,
                                    const float* k_feat, const float* v_feat, cudaStream_t stream) {
  scatter_features<<<grid_for(static_cast<size_t>(n) * dst.layers * dst.heads * (dst.dim / 2)), kThreads, 0,
                     stream>>>(dst, inv_freq, p0, n, k_feat, v_feat);
  return cudaGetLastError();
}

}  // namespace kvr::cuda
