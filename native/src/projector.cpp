// C ABI of cross-model KV projection (kvrelay.h): cache↔feature block transforms with RoPE
// strip/re-apply, the streaming float64 ridge accumulator (stats, Cholesky solve, held-out SSE)
// and the linear projector (packed f32 weights, apply to blocks or sequence → sequence). Checks
// every pointer, length, index and geometry, then calls the kernels in cpu/projector.cpp. Not the
// fitting loop or artifacts (lib/migrate).
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/gemm.h"
#include "cpu/projector.h"
#include "errors.h"
#include "kvrelay.h"
#include "rope.h"
#include "sequence.h"

struct kvr_ridge {
  size_t n_in = 0, n_out = 0;
  size_t n1 = 0, w = 0;   // n_in + 1, n_in + 1 + n_out
  std::vector<double> a;  // (n1, w): [Gram | cross], upper block triangle of the Gram part
  std::vector<double> yy; // (n_out) Σ y²
  uint64_t rows = 0;
  std::string last_error;

  // Symmetric Gram entry G[i][j] (i, j < n1).
  double g(size_t i, size_t j) const {
    if (j < i) std::swap(i, j);
    // j >= i; stored when j >= 4·floor(i/4), which holds for every j >= i
    return a[i * w + j];
  }
  double c(size_t i, size_t o) const { return a[i * w + n1 + o]; }
};

struct kvr_projector {
  kvr::cpu::KvGeometry src, dst;
  std::vector<double> src_freq, dst_freq;
  kvr::cpu::PackedWeight wk, wv;  // (n_dst, n_src)
  std::vector<float> bk, bv;      // (n_dst)
  // A device backend's copy of the weights (Backend::project_linear), made on first use.
  std::shared_ptr<void> device_weights;
  std::mutex device_mutex;
  // Applies may run concurrently (read-only weights); only the message is shared state.
  std::mutex error_mutex;
  std::string last_error;
};

namespace {

using kvr::fail;
using kvr::format;

constexpr uint32_t kMaxThreads = 4096;
constexpr uint32_t kMaxFeatures = 65536;
constexpr size_t kMaxRidgeDoubles = size_t{1} << 28;  // 2 GiB of statistics
constexpr size_t kMaxBlockElems = size_t{1} << 34;

#define KVR_TRY(expr)                       \
  do {                                      \
    const int32_t kvr_st_ = (expr);         \
    if (kvr_st_ != KVR_OK) return kvr_st_;  \
  } while (0)

int32_t resolve_threads(const char* fn, uint32_t n, int* out) {
  if (n > kMaxThreads)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: n_threads %u > %u", fn, n, kMaxThreads));
  *out = n == 0 ? std::max(1, omp_get_num_procs()) : static_cast<int>(n);
  return KVR_OK;
}

int32_t check_buf(const char* fn, const char* what, const void* p, size_t len, size_t need) {
  if (p == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: %s is NULL", fn, what));
  if (len != need)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: %s length %zu, expected %zu", fn, what, len, need));
  return KVR_OK;
}

// Validates the parts of kvr_model_params a KV block needs: layers, kv heads, even head_dim, RoPE.
int32_t check_geometry(const char* fn, const char* what, const kvr_model_params* p,
                       kvr::cpu::KvGeometry* g) {
  if (p == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: %s is NULL", fn, what));
  if (p->num_layers == 0 || p->num_layers > 4096 || p->num_kv_heads == 0 ||
      p->num_kv_heads > 4096 || p->head_dim == 0 || p->head_dim > 4096 || p->head_dim % 2 != 0)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: %s layers %u, kv_heads %u, head_dim %u (need 1..4096, head_dim even)",
                       fn, what, p->num_layers, p->num_kv_heads, p->head_dim));
  if (!(p->rope_theta > 1.0f) || !std::isfinite(p->rope_theta))
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: %s rope_theta %g must be finite and > 1", fn, what,
                       static_cast<double>(p->rope_theta)));
  if (p->rope_scaling != KVR_ROPE_NONE && p->rope_scaling != KVR_ROPE_LINEAR &&
      p->rope_scaling != KVR_ROPE_LLAMA3)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: %s rope_scaling %u unknown", fn, what, p->rope_scaling));
  if (p->rope_scaling != KVR_ROPE_NONE && !(p->rope_factor > 0.0f && std::isfinite(p->rope_factor)))
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: %s rope_factor %g must be > 0", fn, what,
                                                 static_cast<double>(p->rope_factor)));
  if (p->rope_scaling == KVR_ROPE_LLAMA3 &&
      (!(p->rope_high_freq_factor > p->rope_low_freq_factor) || !(p->rope_low_freq_factor > 0) ||
       p->rope_original_max_position == 0))
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: %s llama3 rope needs high_freq_factor > low_freq_factor > 0 and "
                       "original_max_position > 0 (got %g, %g, %u)",
                       fn, what, static_cast<double>(p->rope_high_freq_factor),
                       static_cast<double>(p->rope_low_freq_factor), p->rope_original_max_position));
  g->layers = p->num_layers;
  g->heads = p->num_kv_heads;
  g->dim = p->head_dim;
  return KVR_OK;
}

int32_t block_elems(const char* fn, const kvr::cpu::KvGeometry& g, uint32_t tokens, size_t* n) {
  if (tokens == 0) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: tokens is 0", fn));
  const unsigned __int128 prod = static_cast<unsigned __int128>(g.width()) * tokens;
  if (prod > kMaxBlockElems)
    return fail(KVR_ERR_OUT_OF_RANGE,
                format("%s: block of %zu features x %u tokens exceeds 2^34 elements", fn,
                       g.width(), tokens));
  *n = static_cast<size_t>(prod);
  return KVR_OK;
}

// Test hook: KVRELAY_PROJECT_VIA_COPIES=1 (read per call) makes kvr_projector_apply_seq take the
// backend-neutral copy path even for two CPU sequences, so tests can compare it with the fast path.
bool force_copy_path() {
  const char* v = std::getenv("KVRELAY_PROJECT_VIA_COPIES");
  return v != nullptr && v[0] == '1' && v[1] == 0;
}

template <class F>
int32_t guarded(const char* fn, std::string* sink, F&& f) {
  int32_t st;
  try {
    st = f();
  } catch (const kvr::BackendError& e) {
    st = fail(e.status, format("%s: %s", fn, e.message.c_str()));
  } catch (const std::bad_alloc&) {
    st = fail(KVR_ERR_OUT_OF_MEMORY, format("%s: out of memory", fn));
  } catch (...) {
    st = fail(KVR_ERR_INTERNAL, format("%s: internal error", fn));
  }
  if (sink != nullptr) {
    try {
      *sink = st == KVR_OK ? std::string() : std::string(kvr_last_error());
    } catch (...) {
      sink->clear();
    }
  }
  return st;
}

int32_t transform(const char* fn, bool to_features, const kvr_model_params* geometry,
                  uint32_t start_pos, uint32_t tokens, const float* k_in, size_t k_in_len,
                  const float* v_in, size_t v_in_len, float* k_out, size_t k_out_len,
                  float* v_out, size_t v_out_len) {
  kvr::cpu::KvGeometry g;
  KVR_TRY(check_geometry(fn, "geometry", geometry, &g));
  size_t n = 0;
  KVR_TRY(block_elems(fn, g, tokens, &n));
  if (static_cast<uint64_t>(start_pos) + tokens > (uint64_t{1} << 32))
    return fail(KVR_ERR_OUT_OF_RANGE,
                format("%s: start_pos %u + tokens %u exceeds 2^32", fn, start_pos, tokens));
  KVR_TRY(check_buf(fn, "k_in", k_in, k_in_len, n));
  KVR_TRY(check_buf(fn, "v_in", v_in, v_in_len, n));
  KVR_TRY(check_buf(fn, "k_out", k_out, k_out_len, n));
  KVR_TRY(check_buf(fn, "v_out", v_out, v_out_len, n));
  return guarded(fn, nullptr, [&] {
    const std::vector<double> freq = kvr::rope_inv_freq(*geometry);
    const std::vector<double> none;
    const int nt = std::max(1, omp_get_num_procs());
    if (to_features) {
      kvr::cpu::cache_to_features(g, freq, start_pos, tokens, k_in, k_out, nt);
      kvr::cpu::cache_to_features(g, none, start_pos, tokens, v_in, v_out, nt);
    } else {
      kvr::cpu::features_to_cache(g, freq, start_pos, tokens, k_in, k_out, nt);
      kvr::cpu::features_to_cache(g, none, start_pos, tokens, v_in, v_out, nt);
    }
    return static_cast<int32_t>(KVR_OK);
  });
}

// Checks a feature subset and an output range against the accumulator.
int32_t check_selection(const char* fn, const kvr_ridge* r, const uint32_t* features,
                        uint32_t n_sel, uint32_t out_start, uint32_t out_count) {
  if (r == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: ridge is NULL", fn));
  if (features == nullptr || n_sel == 0)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: empty feature selection", fn));
  if (n_sel > r->n_in)
    return fail(KVR_ERR_OUT_OF_RANGE,
                format("%s: n_sel %u > n_in %zu", fn, n_sel, r->n_in));
  for (uint32_t s = 0; s < n_sel; ++s) {
    if (features[s] >= r->n_in)
      return fail(KVR_ERR_OUT_OF_RANGE, format("%s: features[%u] = %u >= n_in %zu", fn, s,
                                               features[s], r->n_in));
    if (s > 0 && features[s] <= features[s - 1])
      return fail(KVR_ERR_INVALID_ARGUMENT,
                  format("%s: features must be strictly increasing (features[%u] = %u after %u)",
                         fn, s, features[s], features[s - 1]));
  }
  if (out_count == 0 || static_cast<uint64_t>(out_start) + out_count > r->n_out)
    return fail(KVR_ERR_OUT_OF_RANGE, format("%s: outputs [%u, %u + %u) outside n_out %zu", fn,
                                             out_start, out_start, out_count, r->n_out));
  if (r->rows < 2)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: %llu rows accumulated, need >= 2", fn,
                       static_cast<unsigned long long>(r->rows)));
  return KVR_OK;
}

// Checks that a sequence's model has the KV geometry and RoPE frequencies a projector was built
// for (what = "source" / "target").
int32_t check_seq_model(const char* fn, const char* what, const kvr_seq* seq,
                        const kvr::cpu::KvGeometry& g, const std::vector<double>& freq) {
  const kvr::Model& kv = *seq->model;
  if (kv.layers != g.layers || kv.kv_heads != g.heads || kv.head_dim != g.dim)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: %s sequence's model has layers %zu, kv_heads %zu, head_dim %zu; the "
                       "projector's %s has layers %zu, kv_heads %zu, head_dim %zu",
                       fn, what, kv.layers, kv.kv_heads, kv.head_dim, what, g.layers, g.heads,
                       g.dim));
  const std::vector<double>& mf = seq->model->inv_freq;
  if (mf.size() != freq.size())
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: %s sequence's model has %zu RoPE frequencies, the projector's %s %zu",
                       fn, what, mf.size(), what, freq.size()));
  for (size_t i = 0; i < mf.size(); ++i)
    if (mf[i] != freq[i])
      return fail(KVR_ERR_INVALID_ARGUMENT,
                  format("%s: %s sequence's model RoPE differs from the projector's %s "
                         "(inv_freq[%zu] %.17g vs %.17g: rope_theta or rope_scaling)",
                         fn, what, what, i, mf[i], freq[i]));
  return KVR_OK;
}

// Sequence → sequence projection through the backends' copy interface (kv_read F32 of every
// layer → features → GEMM + bias → cache block → kv_write F32), chunk by chunk so scratch stays
// O(chunk · features): the path for sequences that are not both in CPU memory. Same arithmetic as
// kvr_projector_apply on the blocks, so the same bits as the CPU fast path (project_cache).
void project_via_copies(const kvr_projector& p, const kvr_seq& src, kvr_seq& dst, uint32_t n_tokens, int nt) {
  const kvr::Backend& sb = *src.model->backend;
  const kvr::Backend& db = *dst.model->backend;
  const size_t chunk = kvr::cpu::kProjectChunk;
  const size_t ws = p.src.width(), wt = p.dst.width();
  std::vector<float> sblock(chunk * ws), fin(chunk * ws), fout(chunk * wt), dblock(chunk * wt);
  std::vector<float> sv(chunk * ws);
  const std::vector<double> none;
  for (uint32_t start = 0; start < n_tokens; start += static_cast<uint32_t>(chunk)) {
    const uint32_t tokens = static_cast<uint32_t>(std::min<size_t>(chunk, n_tokens - start));
    const size_t s_layer = p.src.heads * tokens * p.src.dim, d_layer = p.dst.heads * tokens * p.dst.dim;
    for (size_t l = 0; l < p.src.layers; ++l)
      sb.kv_read(*src.state, static_cast<uint32_t>(l), start, tokens, KVR_DTYPE_F32, sblock.data() + l * s_layer,
                 sv.data() + l * s_layer);
    std::vector<float> dk(p.dst.layers * d_layer);
    for (int kv = 0; kv < 2; ++kv) {
      const bool keys = kv == 0;
      kvr::cpu::cache_to_features(p.src, keys ? p.src_freq : none, start, tokens, keys ? sblock.data() : sv.data(),
                                  fin.data(), nt);
      kvr::cpu::matmul_xwt(fin.data(), tokens, ws, keys ? p.wk : p.wv, fout.data(), wt, false, nt);
      const float* b = keys ? p.bk.data() : p.bv.data();
      for (size_t t = 0; t < tokens; ++t) {
        float* row = fout.data() + t * wt;
        for (size_t j = 0; j < wt; ++j) row[j] += b[j];
      }
      kvr::cpu::features_to_cache(p.dst, keys ? p.dst_freq : none, start, tokens, fout.data(),
                                  keys ? dk.data() : dblock.data(), nt);
    }
    for (size_t l = 0; l < p.dst.layers; ++l)
      db.kv_write(*dst.state, static_cast<uint32_t>(l), start, tokens, KVR_DTYPE_F32, dk.data() + l * d_layer,
                  dblock.data() + l * d_layer);
  }
}

// Unpacks a packed f32 weight (panels of 16 output rows, k-major) into (n, k) row-major.
void unpack_rows(const kvr::cpu::PackedWeight& w, float* out) {
  const size_t n = w.rows(), k = w.cols(), pw = kvr::cpu::kPanelWidth;
  for (size_t p = 0; p < w.panels(); ++p) {
    const float* panel = w.panel(p);
    for (size_t j = 0; j < pw && p * pw + j < n; ++j)
      for (size_t i = 0; i < k; ++i) out[(p * pw + j) * k + i] = panel[i * pw + j];
  }
}

// The target backend's own projection (both sequences on one GPU), or false for the copy path.
bool project_on_backend(kvr_projector& p, const kvr_seq& src, kvr_seq& dst, uint32_t n_tokens) {
  kvr::LinearProjection lp;
  lp.src_layers = p.src.layers;
  lp.src_heads = p.src.heads;
  lp.src_dim = p.src.dim;
  lp.dst_layers = p.dst.layers;
  lp.dst_heads = p.dst.heads;
  lp.dst_dim = p.dst.dim;
  lp.weights = [&p](bool keys, float* out) { unpack_rows(keys ? p.wk : p.wv, out); };
  lp.bk = p.bk.data();
  lp.bv = p.bv.data();
  lp.slot = &p.device_weights;
  lp.slot_mutex = &p.device_mutex;
  return dst.model->backend->project_linear(*src.state, *src.model->backend, *dst.state, lp, n_tokens);
}

}  // namespace

extern "C" {

KVR_API int32_t kvr_kv_to_features(const kvr_model_params* geometry, uint32_t start_pos,
                                   uint32_t tokens, const float* k_in, size_t k_in_len,
                                   const float* v_in, size_t v_in_len, float* k_out,
                                   size_t k_out_len, float* v_out, size_t v_out_len) {
  return transform("kvr_kv_to_features", true, geometry, start_pos, tokens, k_in, k_in_len, v_in,
                   v_in_len, k_out, k_out_len, v_out, v_out_len);
}

KVR_API int32_t kvr_kv_from_features(const kvr_model_params* geometry, uint32_t start_pos,
                                     uint32_t tokens, const float* k_in, size_t k_in_len,
                                     const float* v_in, size_t v_in_len, float* k_out,
                                     size_t k_out_len, float* v_out, size_t v_out_len) {
  return transform("kvr_kv_from_features", false, geometry, start_pos, tokens, k_in, k_in_len,
                   v_in, v_in_len, k_out, k_out_len, v_out, v_out_len);
}

KVR_API int32_t kvr_ridge_create(uint32_t n_in, uint32_t n_out, kvr_ridge** out_ridge) {
  const char* fn = "kvr_ridge_create";
  if (out_ridge == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: out is NULL", fn));
  *out_ridge = nullptr;
  if (n_in == 0 || n_in > kMaxFeatures || n_out == 0 || n_out > kMaxFeatures)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: n_in %u, n_out %u must be in 1..%u", fn, n_in, n_out, kMaxFeatures));
  const size_t n1 = size_t{n_in} + 1, w = n1 + n_out;
  if (n1 * w > kMaxRidgeDoubles)
    return fail(KVR_ERR_OUT_OF_RANGE,
                format("%s: statistics of %zu x %zu doubles exceed 2^28", fn, n1, w));
  return guarded(fn, nullptr, [&] {
    auto* r = new kvr_ridge();
    try {
      r->n_in = n_in;
      r->n_out = n_out;
      r->n1 = n1;
      r->w = w;
      r->a.assign(n1 * w, 0.0);
      r->yy.assign(n_out, 0.0);
    } catch (...) {
      delete r;
      throw;
    }
    *out_ridge = r;
    return static_cast<int32_t>(KVR_OK);
  });
}

KVR_API void kvr_ridge_free(kvr_ridge* ridge) { delete ridge; }

KVR_API const char* kvr_ridge_last_error(const kvr_ridge* ridge) {
  return ridge == nullptr ? "" : ridge->last_error.c_str();
}

KVR_API int32_t kvr_ridge_accumulate(kvr_ridge* ridge, const float* x, size_t x_len,
                                     const float* y, size_t y_len, uint32_t rows,
                                     uint32_t n_threads) {
  const char* fn = "kvr_ridge_accumulate";
  if (ridge == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: ridge is NULL", fn));
  return guarded(fn, &ridge->last_error, [&]() -> int32_t {
    int nt = 1;
    KVR_TRY(resolve_threads(fn, n_threads, &nt));
    if (rows == 0) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: rows is 0", fn));
    KVR_TRY(check_buf(fn, "x", x, x_len, size_t{rows} * ridge->n_in));
    KVR_TRY(check_buf(fn, "y", y, y_len, size_t{rows} * ridge->n_out));
    for (size_t i = 0; i < x_len; ++i)
      if (!std::isfinite(x[i]))
        return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: x[%zu] = %g is not finite", fn, i,
                                                     static_cast<double>(x[i])));
    for (size_t i = 0; i < y_len; ++i)
      if (!std::isfinite(y[i]))
        return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: y[%zu] = %g is not finite", fn, i,
                                                     static_cast<double>(y[i])));
    kvr::cpu::ridge_accumulate(ridge->a.data(), ridge->yy.data(), ridge->n_in, ridge->n_out, x, y,
                               rows, nt);
    ridge->rows += rows;
    return KVR_OK;
  });
}

KVR_API uint64_t kvr_ridge_rows(const kvr_ridge* ridge) {
  return ridge == nullptr ? 0 : ridge->rows;
}

KVR_API int32_t kvr_ridge_stats(const kvr_ridge* ridge, double* g, size_t g_len, double* c,
                                size_t c_len, double* yy, size_t yy_len) {
  const char* fn = "kvr_ridge_stats";
  if (ridge == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: ridge is NULL", fn));
  const size_t n1 = ridge->n1;
  KVR_TRY(check_buf(fn, "g", g, g_len, n1 * n1));
  KVR_TRY(check_buf(fn, "c", c, c_len, n1 * ridge->n_out));
  KVR_TRY(check_buf(fn, "yy", yy, yy_len, ridge->n_out));
  for (size_t i = 0; i < n1; ++i) {
    for (size_t j = 0; j < n1; ++j) g[i * n1 + j] = ridge->g(i, j);
    for (size_t o = 0; o < ridge->n_out; ++o) c[i * ridge->n_out + o] = ridge->c(i, o);
  }
  for (size_t o = 0; o < ridge->n_out; ++o) yy[o] = ridge->yy[o];
  return KVR_OK;
}

KVR_API int32_t kvr_ridge_solve(const kvr_ridge* ridge, const uint32_t* features, uint32_t n_sel,
                                uint32_t out_start, uint32_t out_count, double lambda,
                                double* w_out, size_t w_len, double* bias_out, size_t bias_len) {
  const char* fn = "kvr_ridge_solve";
  KVR_TRY(check_selection(fn, ridge, features, n_sel, out_start, out_count));
  if (!(lambda >= 0.0) || !std::isfinite(lambda))
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: lambda %g must be finite and >= 0", fn, lambda));
  KVR_TRY(check_buf(fn, "w_out", w_out, w_len, size_t{out_count} * n_sel));
  KVR_TRY(check_buf(fn, "bias_out", bias_out, bias_len, out_count));
  return guarded(fn, nullptr, [&]() -> int32_t {
    const size_t n = n_sel, bias = ridge->n_in;
    const double N = static_cast<double>(ridge->rows);
    std::vector<double> mx(n), my(out_count), s(n * n), rhs(n);
    for (size_t a = 0; a < n; ++a) mx[a] = ridge->g(features[a], bias) / N;
    for (size_t o = 0; o < out_count; ++o) my[o] = ridge->c(bias, out_start + o) / N;
    double trace = 0.0;
    for (size_t a = 0; a < n; ++a) {
      for (size_t b = 0; b <= a; ++b) {
        const double v = ridge->g(features[a], features[b]) / N - mx[a] * mx[b];
        s[a * n + b] = v;
        s[b * n + a] = v;
      }
      trace += s[a * n + a];
    }
    const double scale = trace > 0.0 ? trace / static_cast<double>(n) : 1.0;
    for (size_t a = 0; a < n; ++a) s[a * n + a] += lambda * scale;
    const long bad = kvr::cpu::cholesky(s.data(), n, 1e-12);
    if (bad >= 0)
      return fail(KVR_ERR_INVALID_ARGUMENT,
                  format("%s: feature covariance + lambda·I is not positive definite at pivot %ld "
                         "(feature %u) with lambda %g; raise lambda or drop collinear features",
                         fn, bad, features[bad], lambda));
    std::vector<double> w(size_t{out_count} * n);
    for (size_t o = 0; o < out_count; ++o) {
      const size_t col = out_start + o;
      for (size_t a = 0; a < n; ++a) rhs[a] = ridge->c(features[a], col) / N - mx[a] * my[o];
      kvr::cpu::cholesky_solve(s.data(), n, rhs.data());
      double b = my[o];
      for (size_t a = 0; a < n; ++a) {
        w[o * n + a] = rhs[a];
        b -= rhs[a] * mx[a];
      }
      bias_out[o] = b;
    }
    std::copy(w.begin(), w.end(), w_out);
    return KVR_OK;
  });
}

KVR_API int32_t kvr_ridge_sse(const kvr_ridge* ridge, const uint32_t* features, uint32_t n_sel,
                              uint32_t out_start, uint32_t out_count, const double* w,
                              size_t w_len, const double* bias, size_t bias_len, double* sse_out,
                              size_t sse_len, double* sst_out, size_t sst_len) {
  const char* fn = "kvr_ridge_sse";
  KVR_TRY(check_selection(fn, ridge, features, n_sel, out_start, out_count));
  KVR_TRY(check_buf(fn, "w", w, w_len, size_t{out_count} * n_sel));
  KVR_TRY(check_buf(fn, "bias", bias, bias_len, out_count));
  KVR_TRY(check_buf(fn, "sse_out", sse_out, sse_len, out_count));
  KVR_TRY(check_buf(fn, "sst_out", sst_out, sst_len, out_count));
  return guarded(fn, nullptr, [&]() -> int32_t {
    // u = [w_sel, bias] over augmented indices idx = [features..., n_in]
    const size_t n = n_sel + 1;
    std::vector<uint32_t> idx(features, features + n_sel);
    idx.push_back(static_cast<uint32_t>(ridge->n_in));
    std::vector<double> gs(n * n), u(n), gu(n);
    for (size_t a = 0; a < n; ++a)
      for (size_t b = 0; b < n; ++b) gs[a * n + b] = ridge->g(idx[a], idx[b]);
    const double N = static_cast<double>(ridge->rows);
    for (size_t o = 0; o < out_count; ++o) {
      const size_t col = out_start + o;
      for (size_t a = 0; a < n_sel; ++a) u[a] = w[o * n_sel + a];
      u[n_sel] = bias[o];
      double quad = 0.0, cross = 0.0;
      for (size_t a = 0; a < n; ++a) {
        double v = 0.0;
        for (size_t b = 0; b < n; ++b) v += gs[a * n + b] * u[b];
        quad += u[a] * v;
        cross += u[a] * ridge->c(idx[a], col);
      }
      const double sy = ridge->c(ridge->n_in, col);
      sse_out[o] = std::max(0.0, ridge->yy[col] - 2.0 * cross + quad);
      sst_out[o] = std::max(0.0, ridge->yy[col] - sy * sy / N);
    }
    return KVR_OK;
  });
}

KVR_API int32_t kvr_projector_create(const kvr_model_params* source,
                                     const kvr_model_params* target, const float* wk,
                                     size_t wk_len, const float* bk, size_t bk_len,
                                     const float* wv, size_t wv_len, const float* bv,
                                     size_t bv_len, kvr_projector** out_projector) {
  const char* fn = "kvr_projector_create";
  if (out_projector == nullptr)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: out is NULL", fn));
  *out_projector = nullptr;
  kvr::cpu::KvGeometry gs, gt;
  KVR_TRY(check_geometry(fn, "source", source, &gs));
  KVR_TRY(check_geometry(fn, "target", target, &gt));
  const size_t ns = gs.width(), nt = gt.width();
  if (ns > kMaxFeatures || nt > kMaxFeatures)
    return fail(KVR_ERR_OUT_OF_RANGE,
                format("%s: %zu source / %zu target features exceed %u", fn, ns, nt, kMaxFeatures));
  KVR_TRY(check_buf(fn, "wk", wk, wk_len, nt * ns));
  KVR_TRY(check_buf(fn, "wv", wv, wv_len, nt * ns));
  KVR_TRY(check_buf(fn, "bk", bk, bk_len, nt));
  KVR_TRY(check_buf(fn, "bv", bv, bv_len, nt));
  for (const auto& [name, p, len] : {std::tuple<const char*, const float*, size_t>{"wk", wk, wk_len},
                                     {"wv", wv, wv_len}, {"bk", bk, bk_len}, {"bv", bv, bv_len}})
    for (size_t i = 0; i < len; ++i)
      if (!std::isfinite(p[i]))
        return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: %s[%zu] = %g is not finite", fn, name,
                                                     i, static_cast<double>(p[i])));
  return guarded(fn, nullptr, [&] {
    auto* p = new kvr_projector();
    try {
      p->src = gs;
      p->dst = gt;
      p->src_freq = kvr::rope_inv_freq(*source);
      p->dst_freq = kvr::rope_inv_freq(*target);
      p->wk = kvr::cpu::PackedWeight::pack(wk, nt, ns);
      p->wv = kvr::cpu::PackedWeight::pack(wv, nt, ns);
      p->bk.assign(bk, bk + nt);
      p->bv.assign(bv, bv + nt);
    } catch (...) {
      delete p;
      throw;
    }
    *out_projector = p;
    return static_cast<int32_t>(KVR_OK);
  });
}

KVR_API void kvr_projector_free(kvr_projector* projector) { delete projector; }

KVR_API const char* kvr_projector_last_error(const kvr_projector* cprojector) {
  if (cprojector == nullptr) return "";
  auto* p = const_cast<kvr_projector*>(cprojector);
  // copied into a thread-local buffer under the lock: stable for the caller while other
  // threads' applies may record new messages
  static thread_local std::string copy;
  try {
    std::lock_guard<std::mutex> lock(p->error_mutex);
    copy = p->last_error;
  } catch (...) {
    copy.clear();
  }
  return copy.c_str();
}

KVR_API int32_t kvr_projector_apply(const kvr_projector* cprojector, uint32_t start_pos,
                                    uint32_t tokens, const float* src_k, size_t src_k_len,
                                    const float* src_v, size_t src_v_len, float* dst_k,
                                    size_t dst_k_len, float* dst_v, size_t dst_v_len,
                                    uint32_t n_threads) {
  const char* fn = "kvr_projector_apply";
  if (cprojector == nullptr)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: projector is NULL", fn));
  auto* p = const_cast<kvr_projector*>(cprojector);  // only the message is written
  std::string message;
  const int32_t status = guarded(fn, &message, [&]() -> int32_t {
    int nt = 1;
    KVR_TRY(resolve_threads(fn, n_threads, &nt));
    size_t ns_elems = 0, nt_elems = 0;
    KVR_TRY(block_elems(fn, p->src, tokens, &ns_elems));
    KVR_TRY(block_elems(fn, p->dst, tokens, &nt_elems));
    if (static_cast<uint64_t>(start_pos) + tokens > (uint64_t{1} << 32))
      return fail(KVR_ERR_OUT_OF_RANGE,
                  format("%s: start_pos %u + tokens %u exceeds 2^32", fn, start_pos, tokens));
    KVR_TRY(check_buf(fn, "src_k", src_k, src_k_len, ns_elems));
    KVR_TRY(check_buf(fn, "src_v", src_v, src_v_len, ns_elems));
    KVR_TRY(check_buf(fn, "dst_k", dst_k, dst_k_len, nt_elems));
    KVR_TRY(check_buf(fn, "dst_v", dst_v, dst_v_len, nt_elems));
    const size_t ws = p->src.width(), wt = p->dst.width();
    std::vector<float> fin(ns_elems), fout(nt_elems);
    const std::vector<double> none;
    for (int kv = 0; kv < 2; ++kv) {
      const bool keys = kv == 0;
      kvr::cpu::cache_to_features(p->src, keys ? p->src_freq : none, start_pos, tokens,
                                  keys ? src_k : src_v, fin.data(), nt);
      kvr::cpu::matmul_xwt(fin.data(), tokens, ws, keys ? p->wk : p->wv, fout.data(), wt, false, nt);
      const float* b = keys ? p->bk.data() : p->bv.data();
      for (size_t t = 0; t < tokens; ++t) {
        float* row = fout.data() + t * wt;
        for (size_t j = 0; j < wt; ++j) row[j] += b[j];
      }
      kvr::cpu::features_to_cache(p->dst, keys ? p->dst_freq : none, start_pos, tokens,
                                  fout.data(), keys ? dst_k : dst_v, nt);
    }
    return KVR_OK;
  });
  if (status != KVR_OK) {
    try {
      std::lock_guard<std::mutex> lock(p->error_mutex);
      p->last_error = message;
    } catch (...) {
    }
  }
  return status;
}

KVR_API int32_t kvr_projector_apply_seq(const kvr_projector* cprojector, const kvr_seq* src,
                                        kvr_seq* dst, uint32_t n_tokens, uint32_t n_threads) {
  const char* fn = "kvr_projector_apply_seq";
  if (cprojector == nullptr)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: projector is NULL", fn));
  auto* p = const_cast<kvr_projector*>(cprojector);  // only the message is written
  std::string message;
  const int32_t status = guarded(fn, &message, [&]() -> int32_t {
    if (src == nullptr || dst == nullptr)
      return fail(KVR_ERR_INVALID_ARGUMENT,
                  format("%s: %s sequence is NULL", fn, src == nullptr ? "source" : "target"));
    if (src == dst)
      return fail(KVR_ERR_INVALID_ARGUMENT,
                  format("%s: source and target are the same sequence", fn));
    int nt = 1;
    KVR_TRY(resolve_threads(fn, n_threads, &nt));
    KVR_TRY(check_seq_model(fn, "source", src, p->src, p->src_freq));
    KVR_TRY(check_seq_model(fn, "target", dst, p->dst, p->dst_freq));
    if (n_tokens == 0) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: n_tokens is 0", fn));
    if (n_tokens > src->length)
      return fail(KVR_ERR_OUT_OF_RANGE,
                  format("%s: n_tokens %u exceeds the source sequence's length %u", fn, n_tokens,
                         src->length));
    if (dst->length != 0)
      return fail(KVR_ERR_INVALID_ARGUMENT,
                  format("%s: the target sequence must be empty, holds %u tokens", fn,
                         dst->length));
    if (n_tokens > dst->capacity)
      return fail(KVR_ERR_CAPACITY,
                  format("%s: n_tokens %u exceeds the target sequence's capacity %u", fn,
                         n_tokens, dst->capacity));
    const kvr::KvCache* src_cpu = kvr::cpu::cpu_cache(src->state.get());
    kvr::KvCache* dst_cpu = kvr::cpu::cpu_cache(dst->state.get());
    if (src_cpu != nullptr && dst_cpu != nullptr && !force_copy_path()) {
      // both caches in CPU memory: project in place, chunks in parallel
      if (!kvr::cpu::project_cache(*src_cpu, p->src_freq, *dst_cpu, p->dst_freq, p->wk,
                                   p->bk.data(), p->wv, p->bv.data(), n_tokens, nt))
        return fail(KVR_ERR_OUT_OF_MEMORY, format("%s: out of memory (GEMM scratch)", fn));
    } else if (force_copy_path() || !project_on_backend(*p, *src, *dst, n_tokens)) {
      project_via_copies(*p, *src, *dst, n_tokens, nt);
    }
    dst->length = n_tokens;
    return KVR_OK;
  });
  if (status != KVR_OK) {
    if (dst != nullptr) {
      try {
        dst->last_error = message;
      } catch (...) {
        dst->last_error.clear();
      }
    }
    try {
      std::lock_guard<std::mutex> lock(p->error_mutex);
      p->last_error = message;
    } catch (...) {
    }
  }
  return status;
}

}  // extern "C"
