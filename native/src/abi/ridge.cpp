// C ABI of the streaming float64 ridge accumulator (kvrelay.h kvr_ridge_*): create, accumulate
// (Gram update kernel in host/projection_kernels.h), statistics, Cholesky solve with an unpenalised
// intercept and held-out SSE from the statistics alone. Not the fitting loop (lib/migrate).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "abi/projection_checks.h"
#include "abi/ridge.h"
#include "host/ridge_kernels.h"
#include "kvrelay.h"

namespace {

using namespace kvr::proj;

constexpr size_t kMaxRidgeDoubles = size_t{1} << 28;  // 2 GiB of statistics

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

}  // namespace

extern "C" {

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

}  // extern "C"
