// CPU kernels of cross-model KV projection (kvrelay.h "Cross-model KV projection"): RoPE
// removal/re-application between cache blocks and feature blocks, the fused cache → cache linear
// projection, the float64 ridge accumulation (Gram update) and the Cholesky solve. Shapes are
// trusted here; native/src/projector.cpp checks every argument. Not the C ABI, not the model's
// own RoPE (cpu/forward.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu/gemm.h"
#include "kv_cache.h"
#include "kvrelay.h"

namespace kvr::cpu {

// Block geometry: layers, kv_heads, head_dim of one model.
struct KvGeometry {
  size_t layers = 0, heads = 0, dim = 0;
  size_t width() const { return layers * heads * dim; }  // features per token
};

// cache (L, H, T, D) → features (T, L*H*D); keys de-rotated at positions start_pos + t when
// inv_freq is non-empty (values: pass an empty inv_freq).
void cache_to_features(const KvGeometry& g, const std::vector<double>& inv_freq, uint32_t start_pos,
                       size_t tokens, const float* in, float* out, int n_threads);
// features (T, L*H*D) → cache (L, H, T, D); keys rotated at start_pos + t (the engine's f32
// cos/sin, rope.h rope_cos_sin_rows, and the rotation in f32, as the engine does) when inv_freq
// is non-empty.
void features_to_cache(const KvGeometry& g, const std::vector<double>& inv_freq, uint32_t start_pos,
                       size_t tokens, const float* in, float* out, int n_threads);

// Tokens per chunk of project_cache: per thread the scratch is about chunk × (source + target
// features) floats, e.g. 96 × (256 + 1024) × 4 B = 480 KiB for tiny-fast → tiny-powerful.
constexpr size_t kProjectChunk = 96;

// The linear projection of positions [0, tokens) from one sequence cache into another, in native
// memory. Per chunk of <= kProjectChunk tokens (one thread per chunk, dynamic schedule): read the
// source keys of every layer (cache dtype → f32), de-rotate with src_freq (as cache_to_features),
// y = x · wkᵀ (matmul_xwt on one thread), y += bk, re-rotate with dst_freq and write in the target
// cache's dtype (as features_to_cache, then f32 → dtype rounding to nearest even); values the same
// without RoPE. Same arithmetic as kv_read(F32) → cache_to_features → matmul_xwt → bias →
// features_to_cache → kv_write(F32), so the same bits. wk/wv (dst width, src width); bk/bv (dst
// width). Allocates all scratch before writing; returns false when a worker's GEMM scratch could
// not be allocated (dst then partly written at positions the caller has not made valid); throws
// std::bad_alloc before any write.
bool project_cache(const KvCache& src, const std::vector<double>& src_freq, KvCache& dst,
                   const std::vector<double>& dst_freq, const PackedWeight& wk, const float* bk,
                   const PackedWeight& wv, const float* bv, size_t tokens, int n_threads);

// A (n1, w) row-major float64, n1 = n_in + 1, w = n_in + 1 + n_out: A[i][j] += Σ_r z_r[i]·z_r[j]
// for z_r = [x_r, 1, y_r], only for j >= 4·floor(i/4) (the upper block triangle of the Gram part
// plus every cross column). yy[o] += Σ_r y_r[o]². rows of x (n_in) and y (n_out) f32.
void ridge_accumulate(double* a, double* yy, size_t n_in, size_t n_out, const float* x,
                      const float* y, size_t rows, int n_threads);

// In-place Cholesky s = L·Lᵀ of the n×n symmetric matrix s (lower triangle used and overwritten
// with L). Returns -1 on success, else the index of the first pivot that is not positive
// (<= rel_tol · max diagonal, or not finite).
long cholesky(double* s, size_t n, double rel_tol);
// Solves L·Lᵀ·x = b in place for one right-hand side b (n).
void cholesky_solve(const double* l, size_t n, double* b);

}  // namespace kvr::cpu
