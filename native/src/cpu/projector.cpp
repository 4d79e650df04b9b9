// CPU kernels of cross-model KV projection (see projector.h): RoPE strip/re-apply between cache
// and feature layouts, the fused sequence-cache → sequence-cache projection, the float64 ridge
// Gram accumulation (4-row register blocks, AVX2 clone chosen at run time) and a plain Cholesky
// factor/solve. No argument checks (projector.cpp).
#include "cpu/projector.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/convert.h"
#include "cpu/simd.h"

namespace kvr::cpu {

namespace {
constexpr size_t kRowChunk = 64;  // rows converted to float64 per Gram pass (bounds scratch)
}  // namespace


namespace {

// cos/sin of (start_pos + t)·inv_freq[i] for every token of a block: (tokens, 2·half) float64,
// cos in [0, half), sin in [half, 2·half). One table per call instead of per (layer, head).
std::vector<double> rope_table(const std::vector<double>& inv_freq, uint32_t start_pos,
                               size_t tokens, int n_threads) {
  const size_t half = inv_freq.size();
  std::vector<double> tab(tokens * 2 * half);
  double* tp = tab.data();
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (long tl = 0; tl < static_cast<long>(tokens); ++tl) {
    const double pos = static_cast<double>(start_pos) + static_cast<double>(tl);
    double* row = tp + static_cast<size_t>(tl) * 2 * half;
    for (size_t i = 0; i < half; ++i) {
      const double ang = pos * inv_freq[i];
      row[i] = std::cos(ang);
      row[half + i] = std::sin(ang);
    }
  }
  return tab;
}

}  // namespace

namespace {

// cos/sin rows of positions pos0 .. pos0+tokens-1 into tab (tokens, 2·half) float64, cos then sin:
// the same values as rope_table (one thread; project_cache calls it per chunk).
void rope_rows(const std::vector<double>& inv_freq, size_t pos0, size_t tokens, double* tab) {
  const size_t half = inv_freq.size();
  for (size_t t = 0; t < tokens; ++t) {
    const double pos = static_cast<double>(pos0) + static_cast<double>(t);
    double* row = tab + t * 2 * half;
    for (size_t i = 0; i < half; ++i) {
      const double ang = pos * inv_freq[i];
      row[i] = std::cos(ang);
      row[half + i] = std::sin(ang);
    }
  }
}

// Every layer's K (values = false) or V of cache positions [pos0, pos0+tokens) → feature rows
// out (tokens, layers·kv_heads·head_dim) f32; keys de-rotated with tab (rope_rows of the same
// positions) exactly as cache_to_features does, values copied (tab = nullptr). tmp: tokens·head_dim
// floats for the dtype conversion of one head's rows.
void gather_rows(const KvCache& kv, bool values, const double* tab, size_t pos0, size_t tokens,
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
          const double* cs = tab + t * 2 * half;
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
void scatter_rows(KvCache& kv, bool values, const double* tab, size_t pos0, size_t tokens,
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
          const double* cs = tab + t * 2 * half;
          for (size_t i = 0; i < half; ++i) {
            const float c = static_cast<float>(cs[i]), sn = static_cast<float>(cs[half + i]);
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
    std::vector<double> tab_src, tab_dst;  // (chunk, head_dim) cos|sin of each model
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
#pragma omp parallel for num_threads(static_cast<int>(nt)) schedule(dynamic, 1) \
    reduction(|| : failed)
  for (long c = 0; c < static_cast<long>(chunks); ++c) {
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
  const std::vector<double> tab = rot ? rope_table(inv_freq, start_pos, tokens, n_threads)
                                      : std::vector<double>();
  const double* tp = tab.data();
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
        // inverse rotate-half: rotate the pair (x[i], x[i+half]) by −pos·inv_freq[i], in double
        const double* cs = tp + t * 2 * half;
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
  const std::vector<double> tab = rot ? rope_table(inv_freq, start_pos, tokens, n_threads)
                                      : std::vector<double>();
  const double* tp = tab.data();
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
        // cos/sin rounded to f32 and the rotation done in f32, as the engine's forward pass does
        const double* cs = tp + t * 2 * half;
        for (size_t i = 0; i < half; ++i) {
          const float c = static_cast<float>(cs[i]), sn = static_cast<float>(cs[half + i]);
          const float a = src[i], b = src[i + half];
          dst[i] = a * c - b * sn;
          dst[i + half] = b * c + a * sn;
        }
      }
    }
  }
}

namespace {

// One 4-row block of the Gram update: rows i0..i0+3 of A (width w), columns j0..w-1, over the
// chunk z (rows, w) float64. The j loop is what the compiler vectorises.
template <int kUnused>
__attribute__((always_inline)) inline void gram_block(double* a, size_t w, size_t i0, size_t ni, const double* z, size_t rows) {
  const size_t j0 = i0;
  double* a0 = a + i0 * w;
  if (ni == 4) {
    double* a1 = a0 + w;
    double* a2 = a1 + w;
    double* a3 = a2 + w;
    for (size_t r = 0; r < rows; ++r) {
      const double* zr = z + r * w;
      const double c0 = zr[i0], c1 = zr[i0 + 1], c2 = zr[i0 + 2], c3 = zr[i0 + 3];
      for (size_t j = j0; j < w; ++j) {
        const double v = zr[j];
        a0[j] += c0 * v;
        a1[j] += c1 * v;
        a2[j] += c2 * v;
        a3[j] += c3 * v;
      }
    }
    return;
  }
  for (size_t q = 0; q < ni; ++q) {
    double* aq = a0 + q * w;
    for (size_t r = 0; r < rows; ++r) {
      const double* zr = z + r * w;
      const double c = zr[i0 + q];
      for (size_t j = j0; j < w; ++j) aq[j] += c * zr[j];
    }
  }
}

KVR_TARGET_AVX2 void gram_block_avx2(double* a, size_t w, size_t i0, size_t ni, const double* z,
                                     size_t rows) {
  gram_block<1>(a, w, i0, ni, z, rows);
}

void gram_block_generic(double* a, size_t w, size_t i0, size_t ni, const double* z, size_t rows) {
  gram_block<0>(a, w, i0, ni, z, rows);
}

}  // namespace

void ridge_accumulate(double* a, double* yy, size_t n_in, size_t n_out, const float* x,
                      const float* y, size_t rows, int n_threads) {
  const size_t n1 = n_in + 1, w = n1 + n_out;
  const bool avx2 = simd::has_avx2();
  std::vector<double> z(kRowChunk * w);  // (chunk rows, w) = [x, 1, y] in float64
  for (size_t r0 = 0; r0 < rows; r0 += kRowChunk) {
    const size_t nr = std::min(kRowChunk, rows - r0);
    for (size_t r = 0; r < nr; ++r) {
      double* zr = z.data() + r * w;
      const float* xr = x + (r0 + r) * n_in;
      const float* yr = y + (r0 + r) * n_out;
      for (size_t i = 0; i < n_in; ++i) zr[i] = xr[i];
      zr[n_in] = 1.0;
      for (size_t o = 0; o < n_out; ++o) {
        zr[n1 + o] = yr[o];
        yy[o] += static_cast<double>(yr[o]) * yr[o];
      }
    }
    const long blocks = static_cast<long>((n1 + 3) / 4);
    const double* zc = z.data();
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1)
    for (long b = 0; b < blocks; ++b) {
      const size_t i0 = static_cast<size_t>(b) * 4;
      const size_t ni = std::min<size_t>(4, n1 - i0);
      if (avx2) {
        gram_block_avx2(a, w, i0, ni, zc, nr);
      } else {
        gram_block_generic(a, w, i0, ni, zc, nr);
      }
    }
  }
}

long cholesky(double* s, size_t n, double rel_tol) {
  double max_diag = 0.0;
  for (size_t i = 0; i < n; ++i) max_diag = std::max(max_diag, std::fabs(s[i * n + i]));
  const double floor = rel_tol * max_diag;
  for (size_t j = 0; j < n; ++j) {
    double d = s[j * n + j];
    for (size_t k = 0; k < j; ++k) d -= s[j * n + k] * s[j * n + k];
    if (!(d > floor) || !std::isfinite(d)) return static_cast<long>(j);
    const double ljj = std::sqrt(d);
    s[j * n + j] = ljj;
    for (size_t i = j + 1; i < n; ++i) {
      double v = s[i * n + j];
      const double* li = s + i * n;
      const double* lj = s + j * n;
      for (size_t k = 0; k < j; ++k) v -= li[k] * lj[k];
      s[i * n + j] = v / ljj;
    }
  }
  return -1;
}

void cholesky_solve(const double* l, size_t n, double* b) {
  for (size_t i = 0; i < n; ++i) {  // L·u = b
    double v = b[i];
    for (size_t k = 0; k < i; ++k) v -= l[i * n + k] * b[k];
    b[i] = v / l[i * n + i];
  }
  for (size_t ii = n; ii-- > 0;) {  // Lᵀ·x = u
    double v = b[ii];
    for (size_t k = ii + 1; k < n; ++k) v -= l[k * n + ii] * b[k];
    b[ii] = v / l[ii * n + ii];
  }
}

}  // namespace kvr::cpu
