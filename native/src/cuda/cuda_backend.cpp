// The CUDA backend (backend.h): uploads the weights once (BF16 stays bf16, F16/F32 become f32,
// q/k/v and gate/up fused as on the CPU), keeps a device KV cache per sequence in the CPU's logical
// layout, runs every forward pass — a prefill, a decode, a sampled decode — as a batched step of
// one sequence (batch_step.cpp: the one CUDA layer loop; a repeated decode step replays a captured
// graph), and copies KV through pinned staging. Every CUDA status is mapped by status.h; a kernel
// fault marks the backend failed (failure()). Design: docs/cuda.md. Declarations: backend_impl.h.
// Paged sequences' (kv_pool.cpp) snapshot chunks, projections and fits run on the device through
// contiguous stages (SlabIo, chunk_stage) copied from / to their blocks (k_kvcopy.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/device_math.h"
#include "common/sample_math.h"
#include "core/backend.h"
#include "core/errors.h"
#include "core/sampler.h"
#include "cuda/backend_impl.h"
#include "cuda/handoff.h"
#include "cuda/status.h"
#include "host/dtype.h"

namespace kvr::cuda {

void CudaBackend::ck(cudaError_t e, const char* what) const {
  if (e == cudaSuccess) return;
  CudaStatus st = map_cuda_error(e, what);
  if (st.sticky) {
    std::lock_guard<std::mutex> lock(fail_mu_);
    if (!failed_.load()) fail_msg_ = "CUDA device " + std::to_string(device_) + " failed: " + st.message;
    failed_.store(true);
  }
  throw BackendError(st.status, std::move(st.message));
}

void CudaBackend::launched(cudaError_t e, const char* what, cudaStream_t st) const {
  ck(e, what);
  if (!(debug_.load() & KVR_DEBUG_SYNC_LAUNCHES)) return;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  ck(cudaStreamIsCapturing(st, &cap), what);
  if (cap == cudaStreamCaptureStatusNone) ck(cudaStreamSynchronize(st), what);
}

void CudaBackend::alloc_dev(DevBuf& b, size_t bytes, const char* what) const {
  ck(cudaMalloc(&b.p, bytes), what);
  b.bytes = bytes;
}

void CudaBackend::grow_pinned(PinnedBuf& b, size_t bytes, const char* what) const {
  if (b.bytes >= bytes) return;
  if (b.p) cudaFreeHost(b.p);
  b.p = nullptr;
  b.bytes = 0;
  ck(cudaHostAlloc(&b.p, bytes, cudaHostAllocDefault), what);
  b.bytes = bytes;
}

void CudaBackend::order_after(cudaStream_t before, cudaStream_t after, const char* what) const {
  cudaEvent_t ready = nullptr;
  ck(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what);
  cudaError_t e = cudaEventRecord(ready, before);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(after, ready, 0);
  cudaEventDestroy(ready);
  ck(e, what);
}

void CudaBackend::ensure_healthy() const {
  if (failed_.load()) throw BackendError(KVR_ERR_INTERNAL, failure() + " (the model must be reloaded)");
}

const void* CudaBackend::upload(const void* host, size_t bytes, const char* what) {
  auto b = std::make_unique<DevBuf>();
  ck(cudaMalloc(&b->p, bytes), what);
  b->bytes = bytes;
  ck(cudaMemcpy(b->p, host, bytes, cudaMemcpyHostToDevice), what);
  weight_bytes_ += bytes;
  bufs_.push_back(std::move(b));
  return bufs_.back()->p;
}

namespace {

// Widens a row of any dtype into f32 (exact for bf16/f16).
void to_f32(const TensorView& t, float* dst) {
  const uint8_t* src = static_cast<const uint8_t*>(t.data);
  const size_t n = t.rows * t.cols;
  for (size_t i = 0; i < n; ++i) dst[i] = load_as_f32(src + i * dtype_size(t.dtype), t.dtype);
}

}  // namespace

const float* CudaBackend::upload_f32(const TensorView* t, const char* what) {
  if (!t) return nullptr;
  std::vector<float> h(t->rows * t->cols);
  to_f32(*t, h.data());
  return static_cast<const float*>(upload(h.data(), h.size() * sizeof(float), what));
}

const float* CudaBackend::upload_bias(std::initializer_list<const TensorView*> parts, const char* what) {
  size_t n = 0;
  for (const TensorView* p : parts) {
    if (!p) return nullptr;
    n += p->rows * p->cols;
  }
  std::vector<float> h(n);
  size_t off = 0;
  for (const TensorView* p : parts) {
    to_f32(*p, h.data() + off);
    off += p->rows * p->cols;
  }
  return static_cast<const float*>(upload(h.data(), n * sizeof(float), what));
}

// Stacks the parts' rows into one (Σ rows, cols) matrix: bf16 when every part is BF16 (kept
// exactly), else f32.
DevMatrix CudaBackend::upload_matrix(std::initializer_list<const TensorView*> parts, const char* what) {
  size_t rows = 0, cols = 0;
  bool all_bf16 = true;
  for (const TensorView* p : parts) {
    rows += p->rows;
    cols = p->cols;
    all_bf16 = all_bf16 && p->dtype == KVR_DTYPE_BF16;
  }
  DevMatrix m;
  m.rows = static_cast<uint32_t>(rows);
  m.cols = static_cast<uint32_t>(cols);
  m.bf16 = all_bf16;
  if (all_bf16) {
    std::vector<uint16_t> h(rows * cols);
    size_t r = 0;
    for (const TensorView* p : parts) {
      std::memcpy(h.data() + r * cols, p->data, p->rows * p->cols * 2);
      r += p->rows;
    }
    m.data = upload(h.data(), h.size() * 2, what);
  } else {
    std::vector<float> h(rows * cols);
    size_t r = 0;
    for (const TensorView* p : parts) {
      to_f32(*p, h.data() + r * cols);
      r += p->rows;
    }
    m.data = upload(h.data(), h.size() * 4, what);
  }
  return m;
}

CudaBackend::CudaBackend(const ModelGeometry& g, const TensorTable& t, int32_t device) : g_(g), device_(device) {
  std::string info;
  const int32_t probe = cuda_probe(device, info);
  if (probe != KVR_OK) throw BackendError(probe, info);
  if (!attention_supports(static_cast<uint32_t>(g.head_dim)))
    throw BackendError(KVR_ERR_UNSUPPORTED,
                       format("the CUDA backend supports head_dim 32, 64, 128 or 256, got %zu", g.head_dim));
  if (g.hidden % 4 != 0)
    throw BackendError(KVR_ERR_UNSUPPORTED, format("the CUDA backend needs hidden_size %% 4 == 0, got %zu", g.hidden));
  use_device();
  int sms = 1;
  ck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  sm_count_ = static_cast<uint32_t>(sms);
  ck(attention_init(), "attention_init");
  lt::CublasLt& lt = lt::CublasLt::instance();
  if (lt.ok()) lt_ = &lt;
  desc_ = info;

  // Embedding table (vocab, hidden): kept bf16 when BF16; doubles as the tied lm_head.
  const TensorView* emb = t.find(KVR_T_EMBED);
  const DevMatrix e = upload_matrix({emb}, "uploading embed_tokens");
  embed_ = e.data;
  embed_bf16_ = e.bf16;
  final_norm_ = upload_f32(t.find(KVR_T_FINAL_NORM), "uploading norm");
  lm_head_ = g.layer_plan.tied_embeddings ? e : upload_matrix({t.find(KVR_T_LM_HEAD)}, "uploading lm_head");
  layers_.resize(g.layers);
  for (size_t l = 0; l < g.layers; ++l) {
    DevLayer& L = layers_[l];
    auto f = [&](uint32_t role) { return t.find(role, l); };
    L.attn_norm = upload_f32(f(KVR_T_ATTN_NORM), "uploading input_layernorm");
    L.mlp_norm = upload_f32(f(KVR_T_MLP_NORM), "uploading post_attention_layernorm");
    if (g.layer_plan.qk_norm) {
      L.q_norm = upload_f32(f(KVR_T_Q_NORM), "uploading q_norm");
      L.k_norm = upload_f32(f(KVR_T_K_NORM), "uploading k_norm");
    }
    L.qkv = upload_matrix({f(KVR_T_Q), f(KVR_T_K), f(KVR_T_V)}, "uploading q/k/v_proj");
    if (g.layer_plan.qkv_bias)
      L.qkv_bias = upload_bias({f(KVR_T_Q_BIAS), f(KVR_T_K_BIAS), f(KVR_T_V_BIAS)}, "uploading q/k/v bias");
    L.o = upload_matrix({f(KVR_T_O)}, "uploading o_proj");
    if (g.layer_plan.o_bias) L.o_bias = upload_f32(f(KVR_T_O_BIAS), "uploading o_proj bias");
    L.gate_up = upload_matrix({f(KVR_T_GATE), f(KVR_T_UP)}, "uploading gate/up_proj");
    if (g.layer_plan.mlp_bias) {
      L.gate_up_bias = upload_bias({f(KVR_T_GATE_BIAS), f(KVR_T_UP_BIAS)}, "uploading gate/up bias");
      L.down_bias = upload_f32(f(KVR_T_DOWN_BIAS), "uploading down_proj bias");
    }
    L.down = upload_matrix({f(KVR_T_DOWN)}, "uploading down_proj");
  }
  inv_freq_ = static_cast<const double*>(upload(g.inv_freq.data(), g.inv_freq.size() * sizeof(double), "uploading RoPE"));
  // cudaMemcpy from pageable memory returns once the bytes are staged, not when they have landed,
  // and it runs on the legacy stream, which the sequences' non-blocking streams do not wait for:
  // the weights are complete only after this.
  ck(cudaStreamSynchronize(cudaStreamLegacy), "waiting for the weight uploads");
}

// Floats rounded up to 256 bytes: every scratch buffer starts 256-byte aligned (cuBLASLt's
// default alignment assumption; 16-byte vector loads).
inline size_t align_floats(size_t n) { return (n + 63) / 64 * 64; }

CudaBackend::Scratch CudaBackend::scratch_layout(void* base, size_t n) const {
  const size_t ldqkv = g_.q_dim + 2 * g_.kv_dim;
  const size_t max_k = std::max({g_.hidden, g_.q_dim, g_.inter});
  Scratch sc;
  float* p = static_cast<float*>(base);
  auto take = [&](size_t floats) {
    float* r = p;
    p += align_floats(floats);
    return r;
  };
  sc.x = take(n * g_.hidden);                  // (n, H) residual stream
  sc.h = take(n * g_.hidden);                  // (n, H) normed
  sc.qkv = take(n * ldqkv);                    // (n, q_dim + 2 kv_dim)
  sc.att = take(n * g_.q_dim);                 // (n, q_dim)
  sc.gu = take(n * 2 * g_.inter);              // (n, 2I) [gate | up]
  sc.split_hi = reinterpret_cast<uint16_t*>(take((n * max_k + 1) / 2));  // (m, K) bf16 for cuBLASLt
  sc.split_lo = reinterpret_cast<uint16_t*>(take((n * max_k + 1) / 2));
  sc.floats = static_cast<size_t>(p - static_cast<float*>(base));
  return sc;
}

std::unique_ptr<SeqState> CudaBackend::create_seq(uint32_t capacity) const {
  ensure_healthy();
  use_device();
  auto s = std::make_unique<CudaSeq>();
  s->b = this;
  s->device = device_;
  s->capacity = capacity;
  ck(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const size_t elem = dtype_size(g_.kv_dtype());
  const size_t kv_bytes = 2 * g_.layers * g_.kv_heads * static_cast<size_t>(capacity) * g_.head_dim * elem;
  alloc_dev(s->kv, kv_bytes, "allocating the KV cache");
  ck(cudaMemsetAsync(s->kv.p, 0, kv_bytes, s->stream), "zeroing the KV cache");
  ck(cudaStreamSynchronize(s->stream), "zeroing the KV cache");
  return s;
}

DevKv CudaBackend::chunk_stage(CudaSeq& s, uint32_t tokens, bp::KvView* paged, bp::KvView* staged) const {
  const size_t es = dtype_size(g_.kv_dtype());
  const size_t bytes = 2 * g_.layers * g_.kv_heads * static_cast<size_t>(tokens) * g_.head_dim * es;
  if (s.stage.bytes < bytes) {
    if (s.stage.p) cudaFree(s.stage.p);
    s.stage.p = nullptr;
    s.stage.bytes = 0;
    alloc_dev(s.stage, bytes, "allocating snapshot chunk staging");
  }
  const size_t bt = s.pool->blocks.tokens_per_block;
  if (!s.d_table.p) alloc_dev(s.d_table, std::max<size_t>(1, (s.capacity + bt - 1) / bt) * 4, "allocating a block table");
  if (!s.table.empty())
    ck(cudaMemcpyAsync(s.d_table.p, s.table.data(), s.table.size() * 4, cudaMemcpyHostToDevice, s.stream),
       "copying the block table");
  *paged = kv_view(s, static_cast<const uint32_t*>(s.d_table.p));
  *staged = bp::KvView{};
  staged->base = s.stage.p;
  staged->span = tokens;
  return DevKv{static_cast<uint8_t*>(s.stage.p), tokens, g_.kv_dtype(), g_.layers, g_.kv_heads, g_.head_dim};
}

void CudaBackend::export_chunk(const SeqState& ss, const ChunkSpec& c, uint8_t* frame, size_t frame_len) const {
  ensure_healthy();
  use_device();
  CudaSeq& s = const_cast<CudaSeq&>(static_cast<const CudaSeq&>(ss));  // staging only; the cache is read
  if (!s.codec) s.codec = std::make_unique<CodecStaging>(codec_copy_threads());
  if (s.paged()) {  // the chunk's positions gathered into the contiguous layout, then the device codec
    const uint32_t T = static_cast<uint32_t>(c.layout.tokens);
    bp::KvView paged, staged;
    const DevKv kv = chunk_stage(s, T, &paged, &staged);
    const uint32_t planes = static_cast<uint32_t>(2 * g_.layers * g_.kv_heads);
    launched(launch_kv_copy(paged, c.start, staged, 0, T, planes, static_cast<uint32_t>(g_.head_dim),
                      static_cast<uint32_t>(dtype_size(g_.kv_dtype())), s.stream),
       "kv copy launch", s.stream);
    ChunkSpec c0 = c;
    c0.start = 0;  // the stage holds positions [start, start + tokens) at 0..
    s.codec->export_chunk(kv, c0, frame, frame_len, s.stream, checker(s.stream));
    return;
  }
  const DevKv kv{static_cast<uint8_t*>(s.kv.p), s.capacity, g_.kv_dtype(), g_.layers, g_.kv_heads, g_.head_dim};
  s.codec->export_chunk(kv, c, frame, frame_len, s.stream, checker(s.stream));
}

void CudaBackend::import_chunk(SeqState& ss, const ChunkSpec& c, const uint8_t* frame, size_t frame_len) const {
  ensure_healthy();
  use_device();
  CudaSeq& s = static_cast<CudaSeq&>(ss);
  if (!s.codec) s.codec = std::make_unique<CodecStaging>(codec_copy_threads());
  if (s.paged()) {  // decoded (and checked) into the contiguous stage, then scattered into the blocks
    const uint32_t T = static_cast<uint32_t>(c.layout.tokens);
    bp::KvView paged, staged;
    const DevKv kv = chunk_stage(s, T, &paged, &staged);
    ChunkSpec c0 = c;
    c0.start = 0;
    s.codec->import_chunk(kv, c0, frame, frame_len, s.stream, checker(s.stream));
    const uint32_t planes = static_cast<uint32_t>(2 * g_.layers * g_.kv_heads);
    launched(launch_kv_copy(staged, 0, paged, c.start, T, planes, static_cast<uint32_t>(g_.head_dim),
                      static_cast<uint32_t>(dtype_size(g_.kv_dtype())), s.stream),
       "kv copy launch", s.stream);
    ck(cudaStreamSynchronize(s.stream), "import_chunk");
    return;
  }
  const DevKv kv{static_cast<uint8_t*>(s.kv.p), s.capacity, g_.kv_dtype(), g_.layers, g_.kv_heads, g_.head_dim};
  s.codec->import_chunk(kv, c, frame, frame_len, s.stream, checker(s.stream));
}

namespace {

// A projector's weights on one device, kept in the projector's slot (LinearProjection).
struct DevProjection {
  int device = -1;
  DevBuf wk, wv, bk, bv;  // (n_dst, n_src) f32 row-major, (n_dst) f32
  DevMatrix mk, mv;
};

}  // namespace

void CudaBackend::slab_open(SlabIo& io, const CudaSeq& s, const CudaBackend& b, cudaStream_t st) const {
  io.s = &s;
  io.b = &b;
  if (!s.paged()) return;
  const ModelGeometry& g = b.g_;
  alloc_dev(io.stage, 2 * g.layers * g.kv_heads * SlabIo::kSlabTokens * g.head_dim * dtype_size(g.kv_dtype()),
            "allocating a slab stage");
  alloc_dev(io.table, std::max<size_t>(1, s.table.size()) * sizeof(uint32_t), "allocating a block table");
  if (!s.table.empty())
    ck(cudaMemcpyAsync(io.table.p, s.table.data(), s.table.size() * sizeof(uint32_t), cudaMemcpyHostToDevice, st),
       "copying a block table");
  io.view = b.kv_view(s, static_cast<const uint32_t*>(io.table.p));
}

DevKv CudaBackend::slab_target(SlabIo& io, uint32_t start) const {
  const ModelGeometry& g = io.b->g_;
  if (!io.s->paged())
    return DevKv{static_cast<uint8_t*>(io.s->kv.p), io.s->capacity, g.kv_dtype(), g.layers, g.kv_heads, g.head_dim};
  return DevKv{static_cast<uint8_t*>(io.stage.p), SlabIo::kSlabTokens, g.kv_dtype(), g.layers, g.kv_heads,
               g.head_dim, start};
}

DevKv CudaBackend::slab_read(SlabIo& io, uint32_t start, uint32_t m, cudaStream_t st) const {
  if (io.s->paged()) {
    const ModelGeometry& g = io.b->g_;
    bp::KvView staged;
    staged.base = io.stage.p;
    staged.span = SlabIo::kSlabTokens;
    launched(launch_kv_copy(io.view, start, staged, 0, m, static_cast<uint32_t>(2 * g.layers * g.kv_heads),
                      static_cast<uint32_t>(g.head_dim), static_cast<uint32_t>(dtype_size(g.kv_dtype())), st),
       "kv copy launch", st);
  }
  return slab_target(io, start);
}

void CudaBackend::slab_write(SlabIo& io, uint32_t start, uint32_t m, cudaStream_t st) const {
  if (!io.s->paged()) return;
  const ModelGeometry& g = io.b->g_;
  bp::KvView staged;
  staged.base = io.stage.p;
  staged.span = SlabIo::kSlabTokens;
  launched(launch_kv_copy(staged, 0, io.view, start, m, static_cast<uint32_t>(2 * g.layers * g.kv_heads),
                    static_cast<uint32_t>(g.head_dim), static_cast<uint32_t>(dtype_size(g.kv_dtype())), st),
     "kv copy launch", st);
}

bool CudaBackend::project_linear(const SeqState& src_s, const Backend& src_backend, SeqState& dst_s,
                                 const LinearProjection& p, uint32_t n_tokens) const {
  const auto* sb = dynamic_cast<const CudaBackend*>(&src_backend);
  if (sb == nullptr || sb->device_ != device_) return false;  // mixed CPU/GPU or two GPUs: copy path
  ensure_healthy();
  sb->ensure_healthy();
  use_device();
  const CudaSeq& src = static_cast<const CudaSeq&>(src_s);
  CudaSeq& dst = static_cast<CudaSeq&>(dst_s);
  const size_t ws = p.src_layers * p.src_heads * p.src_dim, wt = p.dst_layers * p.dst_heads * p.dst_dim;
  std::shared_ptr<DevProjection> w;
  {
    std::lock_guard<std::mutex> lock(*p.slot_mutex);
    w = std::static_pointer_cast<DevProjection>(*p.slot);
    if (w && w->device != device_) return false;  // weights live on another device
    if (!w) {
      w = std::make_shared<DevProjection>();
      w->device = device_;
      std::vector<float> h(wt * ws);
      for (int keys = 1; keys >= 0; --keys) {
        DevBuf& b = keys ? w->wk : w->wv;
        p.weights(keys == 1, h.data());
        alloc_dev(b, h.size() * sizeof(float), "allocating projector weights");
        ck(cudaMemcpy(b.p, h.data(), b.bytes, cudaMemcpyHostToDevice), "uploading projector weights");
        DevBuf& bias = keys ? w->bk : w->bv;
        alloc_dev(bias, wt * sizeof(float), "allocating projector biases");
        ck(cudaMemcpy(bias.p, keys ? p.bk : p.bv, bias.bytes, cudaMemcpyHostToDevice), "uploading projector biases");
        (keys ? w->mk : w->mv) = DevMatrix{b.p, static_cast<uint32_t>(wt), static_cast<uint32_t>(ws), false};
      }
      // The uploads ran on the legacy stream (pageable: staged, maybe not landed); the projection
      // runs on dst.stream, which does not wait for it.
      ck(cudaStreamSynchronize(cudaStreamLegacy), "waiting for the projector upload");
      *p.slot = w;
    }
  }
  // Ordered after the work queued on the source sequence (its prefill), without a host wait.
  order_after(src.stream, dst.stream, "ordering the projection after the source");
  constexpr size_t kTokens = SlabIo::kSlabTokens;  // scratch 2·kTokens·(ws + wt) floats
  DevBuf scratch;
  alloc_dev(scratch, 2 * kTokens * (ws + wt) * sizeof(float), "allocating projection scratch");
  float* fk = static_cast<float*>(scratch.p);
  float* fv = fk + kTokens * ws;
  float* ok = fv + kTokens * ws;
  float* ov = ok + kTokens * wt;
  SlabIo in, out;  // paged caches go through a stage slab by slab
  slab_open(in, src, *sb, dst.stream);
  slab_open(out, dst, *this, dst.stream);
  for (uint32_t start = 0; start < n_tokens; start += kTokens) {
    const uint32_t m = static_cast<uint32_t>(std::min<size_t>(kTokens, n_tokens - start));
    launched(launch_gather_features(slab_read(in, start, m, dst.stream), sb->inv_freq_, start, m, fk, fv, dst.stream),
       "gather launch", dst.stream);
    launched(launch_gemm(fk, ws, m, w->mk, static_cast<const float*>(w->bk.p), ok, wt, false, dst.stream),
             "gemm launch", dst.stream);
    launched(launch_gemm(fv, ws, m, w->mv, static_cast<const float*>(w->bv.p), ov, wt, false, dst.stream),
             "gemm launch", dst.stream);
    launched(launch_scatter_features(slab_target(out, start), inv_freq_, start, m, ok, ov, dst.stream),
             "scatter launch", dst.stream);
    slab_write(out, start, m, dst.stream);
  }
  ck(cudaStreamSynchronize(dst.stream), "projection");
  return true;
}

void CudaBackend::accumulate_fit(const SeqState& dst_s, const FitRequest& r) const {
  const auto* sb = dynamic_cast<const CudaBackend*>(r.src_backend);
  if (sb == nullptr || sb->device_ != device_) return Backend::accumulate_fit(dst_s, r);  // host rows
  ensure_healthy();
  sb->ensure_healthy();
  use_device();
  const CudaSeq& src = static_cast<const CudaSeq&>(*r.src);
  const CudaSeq& dst = static_cast<const CudaSeq&>(dst_s);
  const ModelGeometry &sg = *r.src_geom, &dg = *r.dst_geom;
  const size_t ws = sg.layers * sg.kv_heads * sg.head_dim, wt = dg.layers * dg.kv_heads * dg.head_dim;
  const size_t n1 = ws + 1, stat = n1 * n1 + n1 * wt + wt;  // doubles per K/V: G, C, yy
  // Ordered after the work queued on the source sequence (its prefill), without a host wait.
  order_after(src.stream, dst.stream, "ordering the fit after the source");
  constexpr size_t kTokens = SlabIo::kSlabTokens;  // feature rows per slab: 2·kTokens·(ws + wt) floats
  DevBuf feats, stats, bad;
  alloc_dev(feats, 2 * kTokens * (ws + wt) * sizeof(float), "allocating fit features");
  alloc_dev(stats, 2 * stat * sizeof(double), "allocating fit statistics");
  alloc_dev(bad, sizeof(uint32_t), "allocating the fit flag");
  ck(cudaMemsetAsync(stats.p, 0, 2 * stat * sizeof(double), dst.stream), "zeroing fit statistics");
  ck(cudaMemsetAsync(bad.p, 0, sizeof(uint32_t), dst.stream), "zeroing the fit flag");
  float* xk = static_cast<float*>(feats.p);
  float* xv = xk + kTokens * ws;
  float* yk = xv + kTokens * ws;
  float* yv = yk + kTokens * wt;
  double* sk = static_cast<double*>(stats.p);  // [G | C | yy] keys, then values
  double* sv = sk + stat;
  SlabIo sin, din;  // paged caches go through a stage slab by slab
  slab_open(sin, src, *sb, dst.stream);
  slab_open(din, dst, *this, dst.stream);
  const uint32_t nin = static_cast<uint32_t>(ws), nout = static_cast<uint32_t>(wt);
  uint32_t* d_bad = static_cast<uint32_t*>(bad.p);
  for (uint32_t start = 0; start < r.n_tokens; start += kTokens) {
    const uint32_t m = static_cast<uint32_t>(std::min<size_t>(kTokens, r.n_tokens - start));
    launched(launch_gather_features(slab_read(sin, start, m, dst.stream), sb->inv_freq_, start, m, xk, xv, dst.stream),
       "gather launch", dst.stream);
    launched(launch_gather_features(slab_read(din, start, m, dst.stream), inv_freq_, start, m, yk, yv, dst.stream),
       "gather launch", dst.stream);
    launched(launch_ridge_accumulate(xk, yk, m, nin, nout, sk, sk + n1 * n1, sk + n1 * n1 + n1 * wt, d_bad, dst.stream),
       "fit launch", dst.stream);
    launched(launch_ridge_accumulate(xv, yv, m, nin, nout, sv, sv + n1 * n1, sv + n1 * n1 + n1 * wt, d_bad, dst.stream),
       "fit launch", dst.stream);
  }
  std::vector<double> host(2 * stat);
  uint32_t flag = 0;
  ck(cudaMemcpyAsync(host.data(), stats.p, host.size() * sizeof(double), cudaMemcpyDeviceToHost, dst.stream),
     "copying fit statistics");
  ck(cudaMemcpyAsync(&flag, d_bad, sizeof(flag), cudaMemcpyDeviceToHost, dst.stream), "copying the fit flag");
  ck(cudaStreamSynchronize(dst.stream), "fit accumulation");
  const double* hk = host.data();
  const double* hv = hk + stat;
  r.add_stats(hk, hk + n1 * n1, hk + n1 * n1 + n1 * wt, hv, hv + n1 * n1, hv + n1 * n1 + n1 * wt, r.n_tokens,
              flag != 0);
}

uint8_t* CudaBackend::kv_layer(const CudaSeq& s, size_t layer, bool v) const {
  const size_t plane = g_.kv_heads * static_cast<size_t>(s.capacity) * g_.head_dim * dtype_size(g_.kv_dtype());
  return static_cast<uint8_t*>(s.kv.p) + (2 * layer + (v ? 1 : 0)) * plane;
}

template <class Fn>
void CudaBackend::kv_runs(const CudaSeq& s, uint32_t layer, uint32_t start, uint32_t count, Fn fn) const {
  const size_t row = g_.head_dim * dtype_size(g_.kv_dtype());  // bytes of one position of one head
  if (!s.paged()) {
    const size_t off = static_cast<size_t>(start) * row;
    fn(start, count, kv_layer(s, layer, false) + off, kv_layer(s, layer, true) + off, s.capacity * row);
    return;
  }
  const KvPool& kp = s.pool->blocks;
  const uint32_t bt = static_cast<uint32_t>(kp.tokens_per_block);
  uint8_t* arena = static_cast<uint8_t*>(s.pool->arena.p);
  for (uint32_t p = start; p < start + count;) {
    const uint32_t off = p % bt, len = std::min(bt - off, start + count - p);
    uint8_t* base = arena + static_cast<size_t>(s.table[p / bt]) * kp.bytes_per_block;
    const size_t kplane = static_cast<size_t>(bp::kv_plane(layer, 0, static_cast<uint32_t>(g_.kv_heads), 0));
    const size_t vplane = static_cast<size_t>(bp::kv_plane(layer, 1, static_cast<uint32_t>(g_.kv_heads), 0));
    fn(p, len, base + (kplane * bt + off) * row, base + (vplane * bt + off) * row, bt * row);
    p += len;
  }
}

// C (m, w.rows) [+]= A (m, w.cols) · Wᵀ + bias: GEMV for one row, cuBLASLt (bf16 hi/lo split,
// two products) when loaded and W is bf16, else the mma.sync GEMM.
void CudaBackend::project(cudaStream_t st, void* workspace, const Scratch& sc, const float* a, size_t lda, uint32_t m,
                          const DevMatrix& w, const float* bias, float* c, size_t ldc, bool accumulate) const {
  if (m == 1) {
    launched(launch_gemv(w, a, bias, c, accumulate, st), "gemv launch", st);
    return;
  }
  lt::CublasLt* lt = gemm_lt();
  if (lt && w.bf16) {
    uint16_t* hi = sc.split_hi;
    uint16_t* lo = sc.split_lo;
    launched(launch_split_bf16(a, lda, hi, lo, m, w.cols, st), "split launch", st);
    const uint16_t* wd = static_cast<const uint16_t*>(w.data);
    int rc = lt->matmul_bf16(lo, w.cols, m, wd, w.rows, w.cols, c, ldc, accumulate, workspace,
                             lt::kWorkspaceBytes, st);
    if (rc == 0)
      rc = lt->matmul_bf16(hi, w.cols, m, wd, w.rows, w.cols, c, ldc, true, workspace, lt::kWorkspaceBytes, st);
    if (rc != 0) throw BackendError(KVR_ERR_INTERNAL, format("cublasLtMatmul failed with status %d", rc));
    launched(cudaSuccess, "cuBLASLt matmul", st);
    if (bias) launched(launch_bias_add(c, ldc, bias, m, w.rows, st), "bias launch", st);
    return;
  }
  launched(launch_gemm(a, lda, m, w, bias, c, ldc, accumulate, st), "gemm launch", st);
}

int32_t CudaBackend::forward_sample(SeqState& ss, int32_t token, size_t pos0, const SampleRequest& r,
                                    float* spare) const {
  const kvr_sampler& smp = *r.sampler;
  const sm::RoutePlan plan = sampler_route(smp, r.width, r.wants_logprobs());
  if (plan.route == sm::Route::kRow) return Backend::forward_sample(ss, token, pos0, r, spare);
  Item it;  // a batched step of one item, sampled on the device (batch_step.cpp)
  it.s = &static_cast<CudaSeq&>(ss);
  it.tokens = &token;
  it.n = 1;
  it.pos0 = pos0;
  it.sampler = r.sampler;
  it.width = r.width;
  it.token_out = r.token_out;
  run_items(&it, 1);
  return it.sample_status;
}

void CudaBackend::forward(SeqState& ss, const int32_t* tokens, size_t n, size_t pos0, bool all_positions,
                          float* logits) const {
  Item it;  // a batched step of one item (batch_step.cpp), contiguous or paged
  it.s = &static_cast<CudaSeq&>(ss);
  it.tokens = tokens;
  it.n = n;
  it.pos0 = pos0;
  it.logits = logits;
  it.all_positions = all_positions;
  run_items(&it, 1);
}

void CudaBackend::kv_read(const SeqState& ss, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype,
                          void* k_out, void* v_out) const {
  ensure_healthy();
  use_device();
  if (count == 0) return;
  const CudaSeq& cs = static_cast<const CudaSeq&>(ss);
  CudaSeq& s = const_cast<CudaSeq&>(cs);  // staging buffers only; the cache is not changed
  const uint32_t kd = g_.kv_dtype();
  const size_t es = dtype_size(kd), hd = g_.head_dim, kvh = g_.kv_heads;
  const size_t block = kvh * count * hd * es;  // one of K or V in the cache dtype
  grow_pinned(s.kv_host, 2 * block, "allocating pinned KV staging");
  uint8_t* host = static_cast<uint8_t*>(s.kv_host.p);
  const size_t width = count * hd * es;  // one kv head's row in the staging
  kv_runs(s, layer, start, count, [&](uint32_t p, uint32_t len, uint8_t* kd, uint8_t* vd, size_t pitch) {
    for (int v = 0; v < 2; ++v)
      ck(cudaMemcpy2DAsync(host + v * block + (p - start) * hd * es, width, v ? vd : kd, pitch, len * hd * es, kvh,
                           cudaMemcpyDeviceToHost, s.stream),
         "copying KV to the host");
  });
  ck(cudaStreamSynchronize(s.stream), "kv_read");
  const size_t n = kvh * count * hd, os = dtype_size(dtype);
  for (int v = 0; v < 2; ++v) {
    uint8_t* out = static_cast<uint8_t*>(v ? v_out : k_out);
    const uint8_t* src = host + v * block;
    if (dtype == kd) {
      std::memcpy(out, src, block);
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      const float f = load_as_f32(src + i * es, kd);
      if (dtype == KVR_DTYPE_F32) {
        std::memcpy(out + i * 4, &f, 4);
      } else {
        const uint16_t h = dtype == KVR_DTYPE_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
        std::memcpy(out + i * os, &h, 2);
      }
    }
  }
}

void CudaBackend::kv_write(SeqState& ss, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype,
                           const void* k_in, const void* v_in) const {
  ensure_healthy();
  use_device();
  if (count == 0) return;
  CudaSeq& s = static_cast<CudaSeq&>(ss);
  const uint32_t kd = g_.kv_dtype();
  const size_t es = dtype_size(kd), hd = g_.head_dim, kvh = g_.kv_heads;
  const size_t block = kvh * count * hd * es;
  grow_pinned(s.kv_host, 2 * block, "allocating pinned KV staging");
  uint8_t* host = static_cast<uint8_t*>(s.kv_host.p);
  const size_t n = kvh * count * hd, is = dtype_size(dtype);
  for (int v = 0; v < 2; ++v) {
    const uint8_t* in = static_cast<const uint8_t*>(v ? v_in : k_in);
    uint8_t* dst = host + v * block;
    if (dtype == kd) {
      std::memcpy(dst, in, block);
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      const float f = load_as_f32(in + i * is, dtype);
      if (kd == KVR_DTYPE_F32) {
        std::memcpy(dst + i * 4, &f, 4);
      } else {
        const uint16_t h = kd == KVR_DTYPE_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
        std::memcpy(dst + i * es, &h, 2);
      }
    }
  }
  const size_t width = count * hd * es;
  kv_runs(s, layer, start, count, [&](uint32_t p, uint32_t len, uint8_t* kd, uint8_t* vd, size_t pitch) {
    for (int v = 0; v < 2; ++v)
      ck(cudaMemcpy2DAsync(v ? vd : kd, pitch, host + v * block + (p - start) * hd * es, width, len * hd * es, kvh,
                           cudaMemcpyHostToDevice, s.stream),
         "copying KV to the device");
  });
  ck(cudaStreamSynchronize(s.stream), "kv_write");
}

}  // namespace kvr::cuda

namespace kvr {

std::unique_ptr<Backend> make_cuda_backend(const ModelGeometry& g, const TensorTable& t, int32_t device) {
  return std::make_unique<cuda::CudaBackend>(g, t, device);
}

}  // namespace kvr
