// Fit statistics straight from two sequences (kvrelay.h kvr_ridge_accumulate_seq): checks the
// accumulators and sequences, asks the target sequence's backend to produce the fit rows
// (Backend::accumulate_fit; its default is in backend.cpp) and adds them to the float64
// statistics, all or nothing. Not the Gram kernel (host/ridge_kernels.h) nor the solve (ridge.cpp).
#include <cmath>
#include <cstdint>
#include <vector>

#include "abi/projection_checks.h"
#include "abi/ridge.h"
#include "core/backend.h"
#include "core/model.h"
#include "core/sequence.h"
#include "host/ridge_kernels.h"
#include "kvrelay.h"

namespace {

using namespace kvr::proj;

constexpr const char* kFn = "kvr_ridge_accumulate_seq";

// The first non-finite value of a (rows, width) block, as a BackendError naming it.
void check_finite(const char* what, const float* p, size_t rows, size_t width) {
  for (size_t i = 0; i < rows * width; ++i)
    if (!std::isfinite(p[i]))
      throw kvr::BackendError(KVR_ERR_INVALID_ARGUMENT,
                              format("%s feature [row %zu, column %zu] = %g is not finite", what, i / width, i % width,
                                     static_cast<double>(p[i])));
}

// Adds a device's statistics (FitRequest::add_stats layout) into r.
void add_stats(kvr_ridge* r, const double* g, const double* c, const double* yy, uint64_t rows) {
  const size_t n1 = r->n1, w = r->w, no = r->n_out;
  for (size_t i = 0; i < n1; ++i) {
    for (size_t j = i; j < n1; ++j) r->a[i * w + j] += g[i * n1 + j];
    for (size_t o = 0; o < no; ++o) r->a[i * w + n1 + o] += c[i * no + o];
  }
  for (size_t o = 0; o < no; ++o) r->yy[o] += yy[o];
  r->rows += rows;
}

int32_t check_ridge(const char* name, const kvr_ridge* r, size_t n_in, size_t n_out) {
  if (r == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: %s is NULL", kFn, name));
  if (r->n_in != n_in || r->n_out != n_out)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: %s has n_in %zu, n_out %zu; the sequences' features need n_in %zu (source "
                       "layers x kv_heads x head_dim), n_out %zu (target's)",
                       kFn, name, r->n_in, r->n_out, n_in, n_out));
  return KVR_OK;
}

}  // namespace

extern "C" {

KVR_API int32_t kvr_ridge_accumulate_seq(kvr_ridge* k_ridge, kvr_ridge* v_ridge, const kvr_seq* src,
                                         const kvr_seq* dst, uint32_t n_tokens, uint32_t n_threads) {
  if (k_ridge == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: k_ridge is NULL", kFn));
  // Every message also goes to k_ridge (kvr_ridge_last_error): the call may run on a worker thread.
  return guarded(kFn, &k_ridge->last_error, [&]() -> int32_t {
    if (src == nullptr || dst == nullptr)
      return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: %s is NULL", kFn, src == nullptr ? "src" : "dst"));
    const kvr::Model &sm = *src->model, &dm = *dst->model;
    const size_t n_in = sm.layers * sm.kv_heads * sm.head_dim, n_out = dm.layers * dm.kv_heads * dm.head_dim;
    KVR_TRY(check_ridge("k_ridge", k_ridge, n_in, n_out));
    KVR_TRY(check_ridge("v_ridge", v_ridge, n_in, n_out));
    if (k_ridge == v_ridge)
      return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: k_ridge and v_ridge are the same", kFn));
    if (src == dst) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: src and dst are the same sequence", kFn));
    int nt = 1;
    KVR_TRY(resolve_threads(kFn, n_threads, &nt));
    if (n_tokens == 0 || n_tokens > src->length || n_tokens > dst->length)
      return fail(KVR_ERR_OUT_OF_RANGE,
                  format("%s: n_tokens %u must be in [1, min(source length %u, target length %u)]", kFn, n_tokens,
                         src->length, dst->length));
    kvr::FitRequest r;
    r.src = src->state.get();
    r.src_backend = sm.backend.get();
    r.src_geom = &sm;
    r.dst_geom = &dm;
    r.n_tokens = n_tokens;
    r.n_threads = nt;
    bool delivered = false;
    r.add_rows = [&](const float* xk, const float* yk, const float* xv, const float* yv, size_t rows) {
      check_finite("source key", xk, rows, n_in);
      check_finite("target key", yk, rows, n_out);
      check_finite("source value", xv, rows, n_in);
      check_finite("target value", yv, rows, n_out);
      kvr::cpu::ridge_accumulate(k_ridge->a.data(), k_ridge->yy.data(), n_in, n_out, xk, yk, rows, nt);
      kvr::cpu::ridge_accumulate(v_ridge->a.data(), v_ridge->yy.data(), n_in, n_out, xv, yv, rows, nt);
      k_ridge->rows += rows;
      v_ridge->rows += rows;
      delivered = true;
    };
    r.add_stats = [&](const double* gk, const double* ck, const double* yyk, const double* gv, const double* cv,
                      const double* yyv, uint64_t rows, bool bad) {
      if (bad)
        throw kvr::BackendError(KVR_ERR_INVALID_ARGUMENT,
                                format("a key or value feature of the %u tokens is not finite", n_tokens));
      add_stats(k_ridge, gk, ck, yyk, rows);
      add_stats(v_ridge, gv, cv, yyv, rows);
      delivered = true;
    };
    dm.backend->accumulate_fit(*dst->state, r);
    if (!delivered) return fail(KVR_ERR_INTERNAL, format("%s: the backend delivered no rows", kFn));
    return static_cast<int32_t>(KVR_OK);
  });
}

}  // extern "C"
