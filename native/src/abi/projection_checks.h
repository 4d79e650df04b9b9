// Argument checks shared by the C ABI of cross-model KV projection (kv_features.cpp, ridge.cpp,
// projector.cpp): thread counts, buffer lengths, KV block geometry (RoPE via rope.h check_rope),
// block sizes, and the exception guard that turns throws into statuses. Header-only, internal.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>

#include "core/backend.h"
#include "core/errors.h"
#include "host/projection_kernels.h"
#include "host/rope.h"
#include "kvrelay.h"

namespace kvr::proj {

using kvr::fail;
using kvr::format;

constexpr uint32_t kMaxThreads = 4096;
constexpr uint32_t kMaxFeatures = 65536;
constexpr size_t kMaxBlockElems = size_t{1} << 34;

#define KVR_TRY(expr)                       \
  do {                                      \
    const int32_t kvr_st_ = (expr);         \
    if (kvr_st_ != KVR_OK) return kvr_st_;  \
  } while (0)

inline int32_t resolve_threads(const char* fn, uint32_t n, int* out) {
  if (n > kMaxThreads)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: n_threads %u > %u", fn, n, kMaxThreads));
  *out = n == 0 ? std::max(1, omp_get_num_procs()) : static_cast<int>(n);
  return KVR_OK;
}

inline int32_t check_buf(const char* fn, const char* what, const void* p, size_t len, size_t need) {
  if (p == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: %s is NULL", fn, what));
  if (len != need)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: %s length %zu, expected %zu", fn, what, len, need));
  return KVR_OK;
}

// Validates the parts of kvr_model_params a KV block needs: layers, kv heads, even head_dim, RoPE.
inline int32_t check_geometry(const char* fn, const char* what, const kvr_model_params* p,
                       kvr::cpu::KvGeometry* g) {
  if (p == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: %s is NULL", fn, what));
  if (p->num_layers == 0 || p->num_layers > 4096 || p->num_kv_heads == 0 ||
      p->num_kv_heads > 4096 || p->head_dim == 0 || p->head_dim > 4096 || p->head_dim % 2 != 0)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("%s: %s layers %u, kv_heads %u, head_dim %u (need 1..4096, head_dim even)",
                       fn, what, p->num_layers, p->num_kv_heads, p->head_dim));
  std::string why;
  if (int32_t st = kvr::check_rope(*p, &why))
    return fail(st, format("%s: %s %s", fn, what, why.c_str()));
  g->layers = p->num_layers;
  g->heads = p->num_kv_heads;
  g->dim = p->head_dim;
  return KVR_OK;
}

inline int32_t block_elems(const char* fn, const kvr::cpu::KvGeometry& g, uint32_t tokens, size_t* n) {
  if (tokens == 0) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: tokens is 0", fn));
  const unsigned __int128 prod = static_cast<unsigned __int128>(g.width()) * tokens;
  if (prod > kMaxBlockElems)
    return fail(KVR_ERR_OUT_OF_RANGE,
                format("%s: block of %zu features x %u tokens exceeds 2^34 elements", fn,
                       g.width(), tokens));
  *n = static_cast<size_t>(prod);
  return KVR_OK;
}

template <class F>
inline int32_t guarded(const char* fn, std::string* sink, F&& f) {
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

}  // namespace kvr::proj
