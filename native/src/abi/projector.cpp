// C ABI of the linear KV projector (kvrelay.h kvr_projector_*): packed f32 weights, apply to
// cache blocks, and sequence → sequence through the backend seam (an in-place fast path when both
// caches are CPU caches, else kv_read → project → kv_write per chunk). Checks every argument; the
// kernels are host/projection_kernels.h. Not the transforms (kv_features.cpp) nor the ridge fit (ridge.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "abi/projection_checks.h"
#include "abi/test_paths.h"
#include "core/backend.h"
#include "core/sequence.h"
#include "host/gemm.h"
#include "host/projection_kernels.h"
#include "host/rope.h"
#include "kvrelay.h"

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

using namespace kvr::proj;

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

// The target backend's own projection (both sequences on one GPU), or false for the copy path.
bool project_on_backend(kvr_projector& p, const kvr_seq& src, kvr_seq& dst, uint32_t n_tokens) {
  kvr::LinearProjection lp;
  lp.src_layers = p.src.layers;
  lp.src_heads = p.src.heads;
  lp.src_dim = p.src.dim;
  lp.dst_layers = p.dst.layers;
  lp.dst_heads = p.dst.heads;
  lp.dst_dim = p.dst.dim;
  lp.weights = [&p](bool keys, float* out) { (keys ? p.wk : p.wv).unpack_f32(out); };
  lp.bk = p.bk.data();
  lp.bv = p.bv.data();
  lp.slot = &p.device_weights;
  lp.slot_mutex = &p.device_mutex;
  return dst.model->backend->project_linear(*src.state, *src.model->backend, *dst.state, lp, n_tokens);
}

}  // namespace

extern "C" {

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

KVR_API int32_t kvr_projector_weights(const kvr_projector* projector, uint32_t keys, float* w_out, size_t w_len) {
  const char* fn = "kvr_projector_weights";
  if (projector == nullptr) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: projector is NULL", fn));
  if (keys > 1) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s: keys must be 0 or 1, got %u", fn, keys));
  const kvr::cpu::PackedWeight& w = keys ? projector->wk : projector->wv;
  KVR_TRY(check_buf(fn, "w_out", w_out, w_len, w.rows() * w.cols()));
  w.unpack_f32(w_out);
  return KVR_OK;
}

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
  return kvr::projector_apply_seq(cprojector, src, dst, n_tokens, n_threads, false);
}

}  // extern "C"

namespace kvr {

int32_t projector_apply_seq(const kvr_projector* cprojector, const kvr_seq* src, kvr_seq* dst,
                            uint32_t n_tokens, uint32_t n_threads, bool via_copies) {
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
    dst->model->backend->reserve(*dst->state, 0, n_tokens);  // paged target: blocks all or none
    const kvr::KvCache* src_cpu = src->model->backend->host_cache(*src->state);
    kvr::KvCache* dst_cpu = dst->model->backend->host_cache(*dst->state);
    if (src_cpu != nullptr && dst_cpu != nullptr && !via_copies) {
      // both caches in CPU memory: project in place, chunks in parallel
      if (!kvr::cpu::project_cache(*src_cpu, p->src_freq, *dst_cpu, p->dst_freq, p->wk,
                                   p->bk.data(), p->wv, p->bv.data(), n_tokens, nt))
        return fail(KVR_ERR_OUT_OF_MEMORY, format("%s: out of memory (GEMM scratch)", fn));
    } else if (via_copies || !project_on_backend(*p, *src, *dst, n_tokens)) {
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

}  // namespace kvr
