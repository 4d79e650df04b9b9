// CPU kernels of cross-model KV projection (see projector.h): RoPE strip/re-apply between cache
// and feature layouts and the fused sequence-cache → sequence-cache projection. No argument
// checks (native/src/abi/kv_features.cpp, projector.cpp); the ridge kernels are host/ridge_kernels.cpp.
#include "host/projection_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "host/convert.h"
#include "host/rope.h"
#include "host/simd.h"

namespace kvr::cpu {

namespace {

// cos/sin rows (rope.h rope_cos_sin_rows, the engine's f32 values) of positions start_pos + t
// for every token of a block: (tokens, 2·half). One table per call instead of per (layer, head).
std::vector<float> rope_table(const std::vector<double>& inv_freq, uint32_t start_pos,
                              size_t tokens, int n_threads) {
  const size_t half = inv_freq.size();
  std::vector<float> tab(tokens * 2 * half);
  float* tp = tab.data();
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (long tl = 0; tl < static_cast<long>(tokens); ++tl)
    rope_cos_sin_rows(inv_freq, start_pos + static_cast<size_t>(tl), 1, tp + static_cast<size_t>(tl) * 2 * half,
                      2 * half);
  return tab;
}

}  // namespace

namespace {

// cos/sin rows of positions pos0 .. pos0+tokens-1 into tab (tokens, 2·half): the same values as
// rope_table (one thread; project_cache calls it per chunk).
void rope_rows(const std::vector<double>& inv_freq, size_t pos0, size_t tokens, float* tab) {
  rope_cos_sin_rows(inv_freq, pos0, tokens, tab, 2 * inv_freq.size());
}

// Every layer's K (values = false) or V of cache positions [pos0, pos0+tokens) → feature rows
// out (tokens, layers·kv_heads·head_dim) f32; keys de-rotated with tab (rope_rows of the same
// positions) exactly as cache_to_features does, values copied (tab = nullptr). tmp: tokens·head_dim
// floats for the dtype conversion of one head's rows.
void gather_rows(const KvCache& kv, bool values, const float* tab, size_t pos0, size_t tokens,
                 float* out, float* tmp) {
  const size_t D = kv.head_dim, half = D / 2, H = kv.kv_heads, W = kv.layers * H * D;
  for (size_t l = 0; l < kv.layers; ++l) {
    for (size_t h = 0; h < H; ++h) {
      for (size_t t0 = 0; t0 < tokens;) {  // runs of positions contiguous in the cache
        const size_t len = std::min(kv.run(pos0 + t0), tokens - t0);
        const uint8_t* at = kv.at(l, values ? 1 : 0, h, pos0 + t0);  // (len, D)
        const float* rows = reinterpret_cast<const float*>(at);
        if (kv.dtype != KVR_DTYPE_F32) {
          to_f32(at, kv.dtype, tmp, len * D);
          rows = tmp;
        }
        for (size_t t = t0; t < t0 + len; ++t) {
          const float* src = rows + (t - t0) * D;
          float* dst = out + t * W + (l * H + h) * D;
          if (tab == nullptr) {
            for (size_t d = 0; d < D; ++d) dst[d] = src[d];
            continue;
          }
          const float* cs = tab + t * 2 * half;
          for (size_t i = 0; i < half; ++i) {
            const double c = cs[i], sn = cs[half + i];
            const double a = src[i], b = src[i + half];
            dst[i] = static_cast<float>(a * c + b * sn);
            dst[i + half] = static_cast<float>(b * c - a * sn);
          }
        }
        t0 += len;
      }
    }
  }
}

// Feature rows in (tokens, W) + bias (W) → every layer's K (values = false) or V at cache
// positions [pos0, pos0+tokens), keys rotated with tab exactly as features_to_cache does (f32
// cos/sin, f32 rotation), then rounded to the cache dtype. tmp: tokens·head_dim floats.
void scatter_rows(KvCache& kv, bool values, const float* tab, size_t pos0, size_t tokens,
                  const float* in, const float* bias, float* tmp) {
  const size_t D = kv.head_dim, half = D / 2, H = kv.kv_heads, W = kv.layers * H * D;
  for (size_t l = 0; l < kv.layers; ++l) {
    for (size_t h = 0; h < H; ++h) {
      for (size_t t0 = 0; t0 < tokens;) {  // runs of positions contiguous in the cache
        const size_t len = std::min(kv.run(pos0 + t0), tokens - t0);
        uint8_t* at = kv.at(l, values ? 1 : 0, h, pos0 + t0);  // (len, D)
        const bool direct = kv.dtype == KVR_DTYPE_F32;
        float* rows = direct ? reinterpret_cast<float*>(at) : tmp;
        const float* b = bias + (l * H + h) * D;
        for (size_t t = t0; t < t0 + len; ++t) {
          const float* src = in + t * W + (l * H + h) * D;
          float* dst = rows + (t - t0) * D;
          if (tab == nullptr) {
            for (size_t d = 0; d < D; ++d) dst[d] = src[d] + b[d];
            continue;
          }
          const float* cs = tab + t * 2 * half;
          for (size_t i = 0; i < half; ++i) {
            const float c = cs[i], sn = cs[half + i];
            const float x0 = src[i] + b[i], x1 = src[i + half] + b[i + half];
            dst[i] = x0 * c - x1 * sn;
            dst[i + half] = x1 * c + x0 * sn;
          }
        }
        if (!direct) from_f32(tmp, kv.dtype, at, len * D);
        t0 += len;
      }
    }
  }
}

}  // namespace

bool project_cache(const KvCache& src, const std::vector<double>& src_freq, KvCache& dst,
                   const std::vector<double>& dst_freq, const PackedWeight& wk, const float* bk,
                   const PackedWeight& wv, const float* bv, size_t tokens, int n_threads) {
  if (tokens == 0) return true;
  const size_t ws = src.layers * src.kv_heads * src.head_dim;
  const size_t wt = dst.layers * dst.kv_heads * dst.head_dim;
  size_t nt = static_cast<size_t>(std::max(1, n_threads));
  // chunks of a multiple of the GEMM tile height (6), small enough that every thread gets work
  size_t chunk = (tokens + nt - 1) / nt;
  chunk = std::min(kProjectChunk, std::max<size_t>(6, (chunk + 5) / 6 * 6));
  const size_t chunks = (tokens + chunk - 1) / chunk;
  nt = std::min(nt, chunks);
  struct Buffers {
    std::vector<float> fin, fout, tmp;  // (chunk, ws), (chunk, wt), (chunk, max head_dim)
    std::vector<float> tab_src, tab_dst;  // (chunk, head_dim) cos|sin of each model
  };
  std::vector<Buffers> bufs(nt);  // all scratch up front: std::bad_alloc here writes nothing
  for (Buffers& b : bufs) {
    b.fin.resize(chunk * ws);
    b.fout.resize(chunk * wt);
    b.tmp.resize(chunk * std::max(src.head_dim, dst.head_dim));
    b.tab_src.resize(chunk * 2 * src_freq.size());
    b.tab_dst.resize(chunk * 2 * dst_freq.size());
  }
  bool failed = false;  // an exception may not leave an OpenMP region: carry it out by hand
  const KernelChoice* choice = current_choice_ptr();  // the caller's cap, on every thread
#pragma omp parallel for num_threads(static_cast<int>(nt)) schedule(dynamic, 1) \
    reduction(|| : failed)
  for (long c = 0; c < static_cast<long>(chunks); ++c) {
    const KernelScope scope(choice);
    Buffers& b = bufs[static_cast<size_t>(omp_get_thread_num())];
    const size_t t0 = static_cast<size_t>(c) * chunk, n = std::min(chunk, tokens - t0);
    try {
      rope_rows(src_freq, t0, n, b.tab_src.data());
      rope_rows(dst_freq, t0, n, b.tab_dst.data());
      for (int kv = 0; kv < 2; ++kv) {
        const bool values = kv == 1;
        gather_rows(src, values, values ? nullptr : b.tab_src.data(), t0, n, b.fin.data(),
                    b.tmp.data());
        matmul_xwt(b.fin.data(), n, ws, values ? wv : wk, b.fout.data(), wt, false, 1);
        scatter_rows(dst, values, values ? nullptr : b.tab_dst.data(), t0, n, b.fout.data(),
                     values ? bv : bk, b.tmp.data());
      }
    } catch (...) {  // only std::bad_alloc from the GEMM's per-thread packing scratch can occur
      failed = true;
    }
  }
  return !failed;
}

void cache_to_features(const KvGeometry& g, const std::vector<double>& inv_freq, uint32_t start_pos,
                       size_t tokens, const float* in, float* out, int n_threads) {
  const size_t D = g.dim, half = D / 2, W = g.width();
  const bool rot = !inv_freq.empty();
  const std::vector<float> tab = rot ? rope_table(inv_freq, start_pos, tokens, n_threads)
                                     : std::vector<float>();
  const float* tp = tab.data();
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (long tl = 0; tl < static_cast<long>(tokens); ++tl) {
    const size_t t = static_cast<size_t>(tl);
    for (size_t l = 0; l < g.layers; ++l) {
      for (size_t h = 0; h < g.heads; ++h) {
        const float* src = in + ((l * g.heads + h) * tokens + t) * D;
        float* dst = out + t * W + (l * g.heads + h) * D;
        if (!rot) {
          for (size_t d = 0; d < D; ++d) dst[d] = src[d];
          continue;
        }
        // inverse rotate-half in double with the engine's f32 cos/sin: undoes the rotation the
        // engine applied (rotate by −pos·inv_freq[i])
        const float* cs = tp + t * 2 * half;
        for (size_t i = 0; i < half; ++i) {
          const double c = cs[i], sn = cs[half + i];
          const double a = src[i], b = src[i + half];
          dst[i] = static_cast<float>(a * c + b * sn);
          dst[i + half] = static_cast<float>(b * c - a * sn);
        }
      }
    }
  }
}

void features_to_cache(const KvGeometry& g, const std::vector<double>& inv_freq, uint32_t start_pos,
                       size_t tokens, const float* in, float* out, int n_threads) {
  const size_t D = g.dim, half = D / 2, W = g.width();
  const bool rot = !inv_freq.empty();
  const std::vector<float> tab = rot ? rope_table(inv_freq, start_pos, tokens, n_threads)
                                     : std::vector<float>();
  const float* tp = tab.data();
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (long tl = 0; tl < static_cast<long>(tokens); ++tl) {
    const size_t t = static_cast<size_t>(tl);
    for (size_t l = 0; l < g.layers; ++l) {
      for (size_t h = 0; h < g.heads; ++h) {
        const float* src = in + t * W + (l * g.heads + h) * D;
        float* dst = out + ((l * g.heads + h) * tokens + t) * D;
        if (!rot) {
          for (size_t d = 0; d < D; ++d) dst[d] = src[d];
          continue;
        }
        // the engine's f32 cos/sin and the rotation in f32, as the forward pass does
        const float* cs = tp + t * 2 * half;
        for (size_t i = 0; i < half; ++i) {
          const float c = cs[i], sn = cs[half + i];
          const float a = src[i], b = src[i + half];
          dst[i] = a * c - b * sn;
          dst[i + half] = b * c + a * sn;
        }
      }
    }
  }
}

}  // namespace kvr::cpu
