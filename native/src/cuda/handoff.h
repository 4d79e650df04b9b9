// Host-side launchers of the GPU-resident handoff kernels (docs/gpu-handoff.md): the snapshot
// chunk codec (codec.cu), KV projection between two device caches (projector.cu), ridge-fit
// XᵀX / XᵀY accumulation (fit.cu) and the greedy / top-k sampling reduction (sample.cu).
// Every pointer is device memory unless named *_host; every launcher enqueues on `stream` and
// returns cudaGetLastError(). The arithmetic that must equal the CPU's bit for bit is written
// with the uncontracted helpers of common/device_math.h. Not the backend glue (codec_host.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/chunk_layout.h"

namespace kvr::cuda {

// A sequence's device KV cache: (layer, {K, V}, kv_head, capacity, head_dim) in kv_dtype.
// `first`: the position of the buffer's row 0 — a stage holding a paged sequence's positions
// [first, first + capacity) (cuda_backend.cpp); honoured by the projection gather / scatter only
// (the codec is given start 0 instead).
struct DevKv {
  uint8_t* base = nullptr;
  uint32_t capacity = 0;
  uint32_t kv_dtype = 0;  // kvr_dtype
  size_t layers = 0, heads = 0, dim = 0;
  uint32_t first = 0;
};

// ---- snapshot chunk codec (codec.cu) ----

// Encodes layers [l0, l1) of chunk (layout L, cache positions start..) into the device frame
// (the whole unsigned frame's buffer; only those layers' blocks are written). q8/q4: a block with
// a non-finite value lowers *d_bad to 2·layer + (V ? 1 : 0) (atomicMin; the caller sets it to
// UINT32_MAX first) and its bytes are then meaningless.
cudaError_t launch_encode_layers(const DevKv& kv, const chunk::Layout& L, uint32_t start, size_t l0, size_t l1,
                                 uint8_t* d_frame, uint32_t* d_bad, cudaStream_t stream);

// Raw CRC32C registers (chunk_layout.h) of the `len` bytes at d_data in pieces of kCrcPiece
// bytes (d_raw: ceil(len / kCrcPiece) words), then their combination; the standard CRC32C of
// the bytes goes to *d_crc (and, when store_at_end, also into the 4 bytes after them, little
// endian: a frame's CRC field).
constexpr size_t kCrcPiece = 1024;
cudaError_t launch_crc32c(const uint8_t* d_data, size_t len, uint32_t* d_raw, uint32_t* d_crc, bool store_at_end,
                          cudaStream_t stream);

// Checks every q8/q4 scale (finite, >= 0) and q4 min (finite) of the device frame; the first
// bad one in (layer, K before V, scales before mins, index) order lowers *d_bad_key (atomicMin,
// caller sets UINT64_MAX) to ((2·layer + part) · 2 + is_min) · 2^32 + index.
cudaError_t launch_check_scales(const chunk::Layout& L, const uint8_t* d_frame, unsigned long long* d_bad_key,
                                cudaStream_t stream);

// Checks every decoded value of the device frame: finite, and finite once rounded to the cache
// dtype (kvr_dtype); the first bad one in (layer, K before V, element) order lowers *d_bad_key
// (atomicMin, caller sets UINT64_MAX) to ((2·layer + part) << 32) | element. Scales checked first.
cudaError_t launch_check_values(const chunk::Layout& L, uint32_t cache_dtype, const uint8_t* d_frame,
                                unsigned long long* d_bad_key, cudaStream_t stream);

// Decodes the whole checked device frame into cache positions start.. of every layer (cache
// dtype rounding to nearest even; same-type lossless chunks are copied bit for bit).
cudaError_t launch_decode_chunk(const DevKv& kv, const chunk::Layout& L, uint32_t start, const uint8_t* d_frame,
                                cudaStream_t stream);

// ---- projection between two device caches (projector.cu) ----

// Gathers positions [p0, p0+n) of every layer of `src` into feature rows (n, layers·heads·dim)
// f32, keys de-rotated with the source RoPE (inv_freq: dim/2 doubles on the device), values as
// they are: (k_feat, v_feat), each row-major with row stride = layers·heads·dim.
cudaError_t launch_gather_features(const DevKv& src, const double* inv_freq, uint32_t p0, uint32_t n, float* k_feat,
                                   float* v_feat, cudaStream_t stream);
// Scatters feature rows (n, layers·heads·dim) of the target into its cache at positions
// [p0, p0+n), keys rotated with the target RoPE, rounded to the cache dtype (nearest even).
cudaError_t launch_scatter_features(const DevKv& dst, const double* inv_freq, uint32_t p0, uint32_t n,
                                    const float* k_feat, const float* v_feat, cudaStream_t stream);

// ---- ridge-fit statistics (fit.cu) ----

// G (n_in+1)² += Σ_rows [x,1]ᵀ[x,1] and C (n_in+1, n_out) += Σ_rows [x,1]ᵀ y over `rows` rows of
// x (rows, n_in) and y (rows, n_out) f32: each product exact in f64 and fma'd into the f64
// accumulators (G, C: f64, device). yy (n_out) f64 += Σ y². Only G's upper triangle (i <= j) is written; the host
// mirrors it. *d_bad is set to 1 when an input is non-finite (nothing is guaranteed then).
cudaError_t launch_ridge_accumulate(const float* x, const float* y, uint32_t rows, uint32_t n_in, uint32_t n_out,
                                    double* g, double* c, double* yy, uint32_t* d_bad, cudaStream_t stream);

// ---- sampling reduction (sample.cu) ----

// The greedy token of one logits row (NaN as -inf, ties to the lowest id; -1 when no logit is
// above -inf) into *d_token, and, when top > 0, the `top` (<= 64) largest logits by (value
// descending, id ascending) into d_top_ids / d_top_logits (fewer when fewer are finite; the
// count into *d_top_count). d_scratch: sample_scratch_bytes(width) bytes.
size_t sample_scratch_bytes(uint32_t width);
cudaError_t launch_sample_reduce(const float* logits, uint32_t width, uint32_t top, int32_t* d_token,
                                 int32_t* d_top_ids, float* d_top_logits, uint32_t* d_top_count, void* d_scratch,
                                 cudaStream_t stream);

}  // namespace kvr::cuda
