// CPU kernels of cross-model KV projection (kvrelay.h "Cross-model KV projection"): RoPE
// removal/re-application between cache blocks and feature blocks and the fused cache → cache
// linear projection. Shapes are trusted here; native/src/abi/kv_features.cpp and projector.cpp check
// every argument. Not the C ABI, not the ridge kernels (host/ridge_kernels.h), not the model's own RoPE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/kv_cache.h"
#include "host/gemm.h"
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

}  // namespace kvr::cpu
