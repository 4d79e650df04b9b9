// Row-wise kernels of the CUDA backend: embedding lookup, RMSNorm, the fused q/k/v
// post-processing (bias, Qwen3 q/k norm, RoPE, KV append), SwiGLU, bias add and the bf16 hi/lo
// split feeding cuBLASLt. Launchers declared in kernels.h. Not attention or projections.
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "kvrelay.h"

namespace kvr::cuda {
namespace {

__global__ void embed_kernel(const int32_t* tokens, const void* table, bool bf16, uint32_t hidden, float* x) {
  const size_t t = blockIdx.x;
  const size_t row = static_cast<size_t>(tokens[t]) * hidden;
  float* out = x + t * hidden;
  if (bf16) {
    const uint16_t* tb = static_cast<const uint16_t*>(table) + row;
    for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = dm::bf16_to_f32(tb[i]);
  } else {
    const float* tf = static_cast<const float*>(table) + row;
    for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = tf[i];
  }
}

// One block (256 threads) per row; idx (nullable) picks the input row.
__global__ void __launch_bounds__(256) rmsnorm_kernel(const float* x, size_t ldx, const uint32_t* idx, float* y,
                                                      size_t ldy, const float* w, uint32_t d, float eps) {
  __shared__ double part[8];
  const float* xr = x + static_cast<size_t>(idx ? idx[blockIdx.x] : blockIdx.x) * ldx;
  float* yr = y + blockIdx.x * ldy;
  double ss = 0.0;
  for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  double tot = 0.0;
#pragma unroll
  for (int i = 0; i < 8; ++i) tot += part[i];
  const float r = static_cast<float>(1.0 / sqrt(tot / static_cast<double>(d) + static_cast<double>(eps)));
  for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = dm::fmul(dm::fmul(xr[i], r), w[i]);
}

constexpr int kQkvWarps = 4;
constexpr uint32_t kMaxHeadDim = 256;

// One block per token; each warp takes whole heads: q heads, then k heads, then v heads. The
// token's position and cache come from its piece (QkvPostArgs.seqs).
template <class Kv>
__global__ void __launch_bounds__(kQkvWarps * 32, 1) qkv_post_kernel(QkvPostArgs a) {
  __shared__ float buf[kQkvWarps][kMaxHeadDim];
  const uint32_t t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t hd = a.head_dim, half = hd / 2;
  const bp::SeqDesc* piece = a.seqs + a.row_seq[t];
  const uint32_t pos = piece->pos0 + (t - piece->row0);
  float* row = a.qkv + static_cast<size_t>(t) * a.ldqkv;
  float* sb = buf[warp];
  const uint32_t total = a.heads + 2 * a.kv_heads;
  for (uint32_t hh = warp; hh < total; hh += kQkvWarps) {
    const bool is_q = hh < a.heads, is_k = !is_q && hh < a.heads + a.kv_heads;
    float* x = row + static_cast<size_t>(hh) * hd;  // q, k and v heads are contiguous in the row
    const float* bias = a.bias ? a.bias + static_cast<size_t>(hh) * hd : nullptr;
    double ss = 0.0;
    for (uint32_t d = lane; d < hd; d += 32) {
      float v = x[d];
      if (bias) v = dm::fadd(v, bias[d]);
      sb[d] = v;
      ss += static_cast<double>(v) * v;
    }
    const float* norm = is_q ? a.q_norm : is_k ? a.k_norm : nullptr;
    if (norm) {
      ss = warp_sum(ss);
      const float r = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(hd) + static_cast<double>(a.eps)));
      __syncwarp();
      for (uint32_t d = lane; d < hd; d += 32) sb[d] = dm::fmul(dm::fmul(sb[d], r), norm[d]);
    }
    __syncwarp();
    if (is_q || is_k) {
      for (uint32_t d = lane; d < half; d += 32) {
        float c, s, o0, o1;
        dm::rope_cos_sin(pos, a.inv_freq[d], &c, &s);
        dm::rope_pair(sb[d], sb[d + half], c, s, &o0, &o1);
        sb[d] = o0;
        sb[d + half] = o1;
      }
      __syncwarp();
    }
    if (is_q) {
      for (uint32_t d = lane; d < hd; d += 32) x[d] = sb[d];
    } else {
      const uint32_t g = is_k ? hh - a.heads : hh - a.heads - a.kv_heads;
      const bp::KvView v = piece->kv;
      typename Kv::T* cache = static_cast<typename Kv::T*>(v.base) +
                              bp::kv_elem_index(v, bp::kv_plane(a.layer, is_k ? 0 : 1, a.kv_heads, g), pos, hd);
      for (uint32_t d = lane; d < hd; d += 32) cache[d] = Kv::store(sb[d]);
    }
    __syncwarp();
  }
}

__global__ void swiglu_kernel(float* gu, uint32_t inter) {
  float* row = gu + static_cast<size_t>(blockIdx.y) * 2 * inter;
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= inter) return;
  const float g = row[i];
  row[i] = g / (1.f + expf(-g)) * row[inter + i];
}

__global__ void bias_add_kernel(float* y, size_t ld, const float* bias, uint32_t cols) {
  float* row = y + static_cast<size_t>(blockIdx.y) * ld;
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < cols) row[i] += bias[i];
}

__global__ void split_bf16_kernel(const float* x, size_t ld, uint16_t* hi, uint16_t* lo, uint32_t cols) {
  const size_t r = blockIdx.y;
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= cols) return;
  uint16_t h, l;
  dm::split_bf16(x[r * ld + i], &h, &l);
  hi[r * cols + i] = h;
  lo[r * cols + i] = l;
}

}  // namespace

cudaError_t launch_embed(const int32_t* tokens, uint32_t n, const void* table, bool bf16, uint32_t hidden, float* x,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  embed_kernel<<<n, 256, 0, stream>>>(tokens, table, bf16, hidden, x);
  return cudaGetLastError();
}

cudaError_t launch_rmsnorm(const float* x, size_t ldx, float* y, size_t ldy, const float* w, uint32_t rows,
                           uint32_t d, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  rmsnorm_kernel<<<rows, 256, 0, stream>>>(x, ldx, nullptr, y, ldy, w, d, eps);
  return cudaGetLastError();
}

cudaError_t launch_rmsnorm_rows(const float* x, size_t ldx, const uint32_t* idx, float* y, size_t ldy, const float* w,
                                uint32_t rows, uint32_t d, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (idx == nullptr) return cudaErrorInvalidValue;
  rmsnorm_kernel<<<rows, 256, 0, stream>>>(x, ldx, idx, y, ldy, w, d, eps);
  return cudaGetLastError();
}

cudaError_t launch_qkv_post(const QkvPostArgs& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  if (a.head_dim > kMaxHeadDim || a.head_dim % 2 != 0) return cudaErrorInvalidValue;
  if (a.seqs == nullptr || a.row_seq == nullptr) return cudaErrorInvalidValue;
  switch (a.kv_dtype) {
    case KVR_DTYPE_F32: qkv_post_kernel<KvF32><<<a.n, kQkvWarps * 32, 0, stream>>>(a); break;
    case KVR_DTYPE_BF16: qkv_post_kernel<KvBF16><<<a.n, kQkvWarps * 32, 0, stream>>>(a); break;
    case KVR_DTYPE_F16: qkv_post_kernel<KvF16><<<a.n, kQkvWarps * 32, 0, stream>>>(a); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_swiglu(float* gu, uint32_t n, uint32_t inter, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  swiglu_kernel<<<dim3(dm::ceil_div(inter, 256), n), 256, 0, stream>>>(gu, inter);
  return cudaGetLastError();
}

cudaError_t launch_bias_add(float* y, size_t ld, const float* bias, uint32_t n, uint32_t cols, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  bias_add_kernel<<<dim3(dm::ceil_div(cols, 256), n), 256, 0, stream>>>(y, ld, bias, cols);
  return cudaGetLastError();
}

cudaError_t launch_split_bf16(const float* x, size_t ld, uint16_t* hi, uint16_t* lo, uint32_t rows, uint32_t cols,
                              cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  split_bf16_kernel<<<dim3(dm::ceil_div(cols, 256), rows), 256, 0, stream>>>(x, ld, hi, lo, cols);
  return cudaGetLastError();
}

}  // namespace kvr::cuda

namespace kvr::cuda {

cudaError_t kernels_loadable() {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, rmsnorm_kernel);
}

}  // namespace kvr::cuda
