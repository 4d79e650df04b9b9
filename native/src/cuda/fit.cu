// Ridge-fit sufficient statistics on the device (docs/gpu-handoff.md §4): G += Σ [x,1]ᵀ[x,1] (upper
// triangle) and C += Σ [x,1]ᵀ y over a block of rows, yy += Σ y². Accuracy is the CPU's kind:
// rows arrive as f32 slabs (32 rows in shared memory) but every product x_i·y_j of two f32 is
// exact in f64 and is fma'd into an f64 accumulator, so G/C are f64 sums of exact products —
// the CPU's (host/ridge_kernels.h) up to summation order (~1e-16 relative per add, growing like f64
// summation with the row count). FP64 throughput (A100 9.7, H100/H200 ~34 TFLOP/s) makes this
// cheap next to the forward passes that produce the rows.
// Compiled, not run. Called by CudaBackend::accumulate_fit (kvr_ridge_accumulate_seq).
#include <cfloat>
#include <cstdint>

#include "cuda/handoff.h"

namespace kvr::cuda {
namespace {

constexpr int kTile = 32, kRowsY = 8, kPer = kTile / kRowsY;

// Value of feature column a of row r: x[r][a] for a < n_in, 1 for the bias column a == n_in.
__device__ __forceinline__ float feature(const float* x, uint32_t n_in, uint32_t r, uint32_t a) {
  return a < n_in ? x[static_cast<size_t>(r) * n_in + a] : 1.0f;
}

// One block per 32×32 output tile: tiles [0, n_g) are G's upper-triangle tiles (ti <= tj), the rest
// C's tiles. threadIdx.x = column in the tile, threadIdx.y + 8k = row in the tile.
__global__ void ridge_tiles(const float* x, const float* y, uint32_t rows, uint32_t n_in, uint32_t n_out, double* g,
                            double* c, uint32_t* bad) {
  __shared__ float as[kTile][kTile + 1];
  __shared__ float bs[kTile][kTile + 1];
  const uint32_t w = n_in + 1, tg = (w + kTile - 1) / kTile, n_g = tg * (tg + 1) / 2;
  uint32_t ti, tj;
  bool is_g = blockIdx.x < n_g;
  if (is_g) {  // blockIdx.x → (ti, tj), ti <= tj, row-major over the upper triangle
    uint32_t b = blockIdx.x;
    ti = 0;
    while (b >= tg - ti) {
      b -= tg - ti;
      ++ti;
    }
    tj = ti + b;
  } else {
    const uint32_t b = blockIdx.x - n_g, tc = (n_out + kTile - 1) / kTile;
    ti = b / tc;
    tj = b % tc;
  }
  const uint32_t tx = threadIdx.x, ty = threadIdx.y;
  double acc[kPer] = {0, 0, 0, 0};
  bool ok = true;
  for (uint32_t r0 = 0; r0 < rows; r0 += kTile) {
    for (uint32_t k = 0; k < kPer; ++k) {
      const uint32_t r = r0 + ty + kRowsY * k;  // slab row loaded by this thread
      const uint32_t a = ti * kTile + tx, bcol = tj * kTile + tx;
      float va = 0.0f, vb = 0.0f;
      if (r < rows) {
        if (a < w) va = feature(x, n_in, r, a);
        if (is_g ? bcol < w : bcol < n_out)
          vb = is_g ? feature(x, n_in, r, bcol) : y[static_cast<size_t>(r) * n_out + bcol];
      }
      ok &= fabsf(va) <= FLT_MAX && fabsf(vb) <= FLT_MAX;
      as[ty + kRowsY * k][tx] = va;
      bs[ty + kRowsY * k][tx] = vb;
    }
    __syncthreads();
    // f32 × f32 is exact in f64 (24 + 24 significant bits < 53): the fma adds the exact product.
#pragma unroll 8
    for (int r = 0; r < kTile; ++r) {
      const double b = bs[r][tx];
#pragma unroll
      for (int k = 0; k < kPer; ++k) acc[k] = fma(static_cast<double>(as[r][ty + kRowsY * k]), b, acc[k]);
    }
    __syncthreads();
  }
  if (!ok) atomicExch(bad, 1u);
  for (uint32_t k = 0; k < kPer; ++k) {
    const uint32_t i = ti * kTile + ty + kRowsY * k, j = tj * kTile + tx;
    if (is_g) {
      if (i < w && j < w && i <= j) g[static_cast<size_t>(i) * w + j] += acc[k];
    } else if (i < w && j < n_out) {
      c[static_cast<size_t>(i) * n_out + j] += acc[k];
    }
  }
}

// yy[j] += Σ_r y[r][j]², f64, one thread per output column.
__global__ void sum_squares(const float* y, uint32_t rows, uint32_t n_out, double* yy) {
  const uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n_out) return;
  double s = 0;
  for (uint32_t r = 0; r < rows; ++r) {
    const double v = y[static_cast<size_t>(r) * n_out + j];
    s += v * v;
  }
  yy[j] += s;
}

}  // namespace

cudaError_t launch_ridge_accumulate(const float* x, const float* y, uint32_t rows, uint32_t n_in, uint32_t n_out,
                                    double* g, double* c, double* yy, uint32_t* d_bad, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const uint32_t tg = (n_in + 1 + kTile - 1) / kTile, tc = (n_out + kTile - 1) / kTile;
  const uint32_t blocks = tg * (tg + 1) / 2 + tg * tc;
  ridge_tiles<<<blocks, dim3(kTile, kRowsY), 0, stream>>>(x, y, rows, n_in, n_out, g, c, d_bad);
  sum_squares<<<(n_out + 255) / 256, 256, 0, stream>>>(y, rows, n_out, yy);
  return cudaGetLastError();
}

}  // namespace kvr::cuda
