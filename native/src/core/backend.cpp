// Every default of the backend seam (backend.h): what a backend runs for each method it does not
// override (paged pool, batched step, sampling step, chunk codec, fit rows, projection, failure and
// debug state). The CPU backend runs most of these as they are; the CUDA backend overrides most. Host work only: kv_read / kv_write, the host chunk
// codec (chunk_codec.h), the CPU sampler (sampler.h) and the host projection kernels.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/chunk_codec.h"
#include "core/sampler.h"
#include "host/projection_kernels.h"
#include "kvrelay.h"

namespace kvr {

// Contiguous caches only: nothing to reserve, no block table, nothing to give back.
void Backend::reserve(SeqState&, size_t, size_t) const {}
PagedView Backend::paged(SeqState&) const { return {}; }
void Backend::shrink(SeqState&, size_t) const {}
uint32_t Backend::blocks_held(const SeqState&) const { return 0; }

std::string Backend::failure() const { return {}; }
void Backend::set_debug(uint32_t) const {}

// No native projection: projector.cpp takes the copy path.
bool Backend::project_linear(const SeqState&, const Backend&, SeqState&, const LinearProjection&, uint32_t) const {
  return false;
}

// No cache in host memory: the neutral layer's in-place fast paths do not apply.
KvCache* Backend::host_cache(SeqState&) const { return nullptr; }

std::shared_ptr<PoolState> Backend::create_pool(uint32_t, uint32_t) const {
  throw BackendError(KVR_ERR_UNSUPPORTED, "this backend has no paged KV pool");
}

std::unique_ptr<SeqState> Backend::create_paged_seq(const std::shared_ptr<PoolState>&, uint32_t) const {
  throw BackendError(KVR_ERR_UNSUPPORTED, "this backend has no paged KV pool");
}

// One forward per entry, in order.
void Backend::forward_batch(BatchEntry* entries, size_t count) const {
  for (size_t i = 0; i < count; ++i) {
    const BatchEntry& e = entries[i];
    forward(*e.s, e.tokens, e.n, e.pos0, false, e.logits ? e.logits : e.spare);
  }
}

// The forward pass writes the last logits row to host memory and the CPU sampler (sampling.cpp)
// picks from it. Backends that can keep the row on their device override it (cuda_backend.cpp).
int32_t Backend::forward_sample(SeqState& s, int32_t token, size_t pos0, const SampleRequest& r,
                                float* spare) const {
  forward(s, &token, 1, pos0, false, spare);
  return sampler_run(r.sampler, spare, r.width, r.token_out, r.logprob_out, r.top_ids, r.top_logprobs, r.top_len,
                     r.top_count_out);
}

void Backend::export_chunk(const SeqState& s, const ChunkSpec& c, uint8_t* frame, size_t frame_len) const {
  host_export_chunk(*this, s, c, frame, frame_len);
}

void Backend::import_chunk(SeqState& s, const ChunkSpec& c, const uint8_t* frame, size_t frame_len) const {
  host_import_chunk(*this, s, c, frame, frame_len);
}

// kv_read of every layer of both sequences → cache_to_features (as the TypeScript fit did through
// kvr_kv_to_features) → r.add_rows (the CPU float64 Gram update).
void Backend::accumulate_fit(const SeqState& dst, const FitRequest& r) const {
  const ModelGeometry &sg = *r.src_geom, &dg = *r.dst_geom;
  const cpu::KvGeometry s{sg.layers, sg.kv_heads, sg.head_dim}, d{dg.layers, dg.kv_heads, dg.head_dim};
  const size_t n = r.n_tokens, s_layer = s.heads * n * s.dim, d_layer = d.heads * n * d.dim;
  // cache blocks (layers, kv_heads, n, head_dim) f32, then feature rows (n, width)
  std::vector<float> sk(s.layers * s_layer), sv(sk.size()), dk(d.layers * d_layer), dv(dk.size());
  for (size_t l = 0; l < s.layers; ++l)
    r.src_backend->kv_read(*r.src, static_cast<uint32_t>(l), 0, r.n_tokens, KVR_DTYPE_F32, sk.data() + l * s_layer,
                           sv.data() + l * s_layer);
  for (size_t l = 0; l < d.layers; ++l)
    kv_read(dst, static_cast<uint32_t>(l), 0, r.n_tokens, KVR_DTYPE_F32, dk.data() + l * d_layer,
            dv.data() + l * d_layer);
  const std::vector<double> none;
  std::vector<float> xk(sk.size()), xv(sk.size()), yk(dk.size()), yv(dk.size());
  cpu::cache_to_features(s, sg.inv_freq, 0, n, sk.data(), xk.data(), r.n_threads);
  cpu::cache_to_features(s, none, 0, n, sv.data(), xv.data(), r.n_threads);
  cpu::cache_to_features(d, dg.inv_freq, 0, n, dk.data(), yk.data(), r.n_threads);
  cpu::cache_to_features(d, none, 0, n, dv.data(), yv.data(), r.n_threads);
  r.add_rows(xk.data(), yk.data(), xv.data(), yv.data(), n);
}

}  // namespace kvr
