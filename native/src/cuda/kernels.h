// Host-side launchers of the CUDA backend's kernels (one .cu file per concept: k_rowwise,
// k_attention, k_gemv, k_gemm). Every pointer is device memory; every launcher enqueues on
// `stream` and returns cudaGetLastError() (launch errors only: execution errors surface at the
// next synchronisation). Positions, caches and block tables are read from the step's device
// metadata (bp::SeqDesc) so that one captured CUDA graph serves every decode step of a shape.
// Activations are f32 row-major; weights are bf16 (as in the checkpoint) or f32.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/batch_plan.h"

namespace kvr::cuda {

// A linear weight (rows, cols) row-major on the device, bf16 or f32.
struct DevMatrix {
  const void* data = nullptr;
  uint32_t rows = 0, cols = 0;
  bool bf16 = false;
};

// cudaSuccess when this build's kernels can run on the current device (an image for its
// architecture is embedded), else the error (cudaErrorNoKernelImageForDevice...).
cudaError_t kernels_loadable();

// x (n, hidden) = table[tokens[i]] widened to f32. tokens: device, n entries, already checked.
cudaError_t launch_embed(const int32_t* tokens, uint32_t n, const void* table, bool bf16, uint32_t hidden,
                         float* x, cudaStream_t stream);

// y (rows, d) = x / sqrt(mean(x²) + eps) · w; the mean square accumulates in double (the CPU's
// order of operations; the sum order differs, so r can differ in its last bit).
cudaError_t launch_rmsnorm(const float* x, size_t ldx, float* y, size_t ldy, const float* w, uint32_t rows,
                           uint32_t d, float eps, cudaStream_t stream);
// The same for chosen rows: y row i = RMSNorm of x row idx[i] (idx: device, `rows` entries).
cudaError_t launch_rmsnorm_rows(const float* x, size_t ldx, const uint32_t* idx, float* y, size_t ldy, const float* w,
                                uint32_t rows, uint32_t d, float eps, cudaStream_t stream);

// Fused q/k/v post-processing for n rows: + bias, Qwen3 per-head RMSNorm of q and k, rotate-half
// RoPE at the row's position (cos/sin from common/device_math.h, the CPU's bits), q written back
// in place, k and v rounded to the cache dtype and written at their positions. Row t belongs to
// seqs[row_seq[t]] (device arrays), at position pos0 + t - row0 of that piece, and its K/V go to
// that sequence's cache (contiguous or paged) at layer `layer`.
struct QkvPostArgs {
  float* qkv = nullptr;           // (n, ldqkv): [q (heads·hd) | k (kv_heads·hd) | v (kv_heads·hd)]
  uint32_t ldqkv = 0;
  uint32_t n = 0;
  const float* bias = nullptr;    // (ldqkv) or null
  const float* q_norm = nullptr;  // (hd) or null (not Qwen3)
  const float* k_norm = nullptr;  // (hd) or null
  const double* inv_freq = nullptr;  // (hd/2), rad/token
  uint32_t heads = 0, kv_heads = 0, head_dim = 0;
  float eps = 0;
  uint32_t kv_dtype = 0;          // kvr_dtype
  const bp::SeqDesc* seqs = nullptr;
  const uint32_t* row_seq = nullptr;
  uint32_t layer = 0;
};
cudaError_t launch_qkv_post(const QkvPostArgs& a, cudaStream_t stream);

// gu (n, 2I) [gate | up] → gu[:, :I] = silu(gate) · up (in place, as the CPU).
cudaError_t launch_swiglu(float* gu, uint32_t n, uint32_t inter, cudaStream_t stream);

// y (n, ld) += bias (cols) per row.
cudaError_t launch_bias_add(float* y, size_t ld, const float* bias, uint32_t n, uint32_t cols, cudaStream_t stream);

// x (rows, cols) f32 with row stride ld → hi, lo (rows, cols) bf16 with hi + lo ≈ x (for cuBLASLt).
cudaError_t launch_split_bf16(const float* x, size_t ld, uint16_t* hi, uint16_t* lo, uint32_t rows, uint32_t cols,
                              cudaStream_t stream);

// Attention of a batched step: the pieces of one launch (bp::plan_batch_attention), each against
// its own sequence's cache (contiguous or paged) at `layer`: causal GQA flash attention, f32
// online softmax, no (T×T) matrix; `splits` > 1 splits the keys (flash-decoding) into `partial`
// and a merge kernel writes `out`. Block b takes rows [blk_row0[b], +rows_per_warp·kAttnWarps) of piece
// blk_piece[b]. Every array is device memory.
struct BatchAttnArgs {
  const float* q = nullptr;  // the group's rows (ldq), piece rows from seqs[..].row0
  uint32_t ldq = 0;
  float* out = nullptr;      // (rows, ldo)
  uint32_t ldo = 0;
  const bp::SeqDesc* seqs = nullptr;    // the group's pieces
  const uint32_t* piece_seq = nullptr;  // launch piece → index into seqs
  const uint32_t* slot0 = nullptr;      // launch piece → its first launch row (partial slots)
  const uint32_t* blk_piece = nullptr;  // grid.x block → launch piece
  const uint32_t* blk_row0 = nullptr;   // grid.x block → first attention row within the piece
  const uint32_t* row_piece = nullptr;  // launch row → launch piece (merge, splits > 1)
  const uint32_t* row_local = nullptr;  // launch row → attention row within the piece (merge)
  uint32_t layer = 0, heads = 0, kv_heads = 0, head_dim = 0, kv_dtype = 0;
  uint32_t total_rows = 0;   // launch rows (partial layout)
  float* partial = nullptr;  // plan.partial_floats floats when splits > 1
};
cudaError_t launch_batch_attention(const BatchAttnArgs& a, uint32_t blocks, uint32_t rows_per_warp, uint32_t splits,
                                   cudaStream_t stream);

// Copies positions [src_pos0, +count) of `src` to [dst_pos0, +count) of `dst` for planes
// [0, planes) ((layer, {K,V}, kv head) planes: 2·layers·kv_heads), head_dim elements of
// elem_bytes each, bytes as they are. Table pointers of paged views: device memory.
cudaError_t launch_kv_copy(const bp::KvView& src, uint32_t src_pos0, const bp::KvView& dst, uint32_t dst_pos0,
                           uint32_t count, uint32_t planes, uint32_t head_dim, uint32_t elem_bytes,
                           cudaStream_t stream);

// Whether the attention kernels are compiled for this head_dim (32, 64, 128, 256).
bool attention_supports(uint32_t head_dim);
// Raises the dynamic shared-memory limit of the attention kernels (once per device).
cudaError_t attention_init();

// Decode projection: y (rows) = W (rows, cols) · x (cols) [+ bias] [+ y if accumulate].
// bf16 weights widened exactly, f32 accumulation, 16-byte weight loads when cols allows.
cudaError_t launch_gemv(const DevMatrix& w, const float* x, const float* bias, float* y, bool accumulate,
                        cudaStream_t stream);

// Decode projection of the RMSNorm of x: y = W · (x / sqrt(mean(x²) + eps) · norm_w) [+ bias]
// [+ y]; each warp reduces x itself (sum of squares in double, as launch_rmsnorm), so the norm
// costs no launch and no pass through memory.
cudaError_t launch_norm_gemv(const DevMatrix& w, const float* x, const float* norm_w, float eps, const float* bias,
                             float* y, bool accumulate, cudaStream_t stream);

// Prefill projection fallback: C (m, w.rows) = A (m, w.cols) · Wᵀ [+ bias] [+ C], tensor cores
// (mma.sync m16n8k16 bf16, f32 accumulate) with A split into bf16 hi + lo (and W too when f32),
// so the result carries f32-level accuracy.
cudaError_t launch_gemm(const float* a, size_t lda, uint32_t m, const DevMatrix& w, const float* bias, float* c,
                        size_t ldc, bool accumulate, cudaStream_t stream);

}  // namespace kvr::cuda
