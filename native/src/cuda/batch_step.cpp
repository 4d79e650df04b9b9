// The CUDA batched step (Backend::forward_batch, docs/batching.md "CUDA"): the rows of every
// sequence concatenated, one GEMM per projection over all of them (project(): GEMV for one row,
// cuBLASLt / mma.sync for more), the fused q/k/v post-processing writing each row's K/V
// into its own sequence's cache (contiguous or paged), attention of all decodes in one launch and
// of all longer pieces in another (each block reads its own sequence's cache), then the final
// norm and lm_head only for the rows that want logits, and greedy / top-k sampling on the device.
// Everything runs on the model's batch stream, ordered against each sequence's own stream by
// events. Every single-sequence forward pass (prefill, decode, sampled decode) is a step of one
// item here: the one CUDA layer loop. Host plans: common/batch_plan.h (g++-tested). Compiled, not
// run.
#include <algorithm>
#include <cstring>
#include <vector>

#include "common/batch_plan.h"
#include "common/sample_math.h"
#include "core/errors.h"
#include "core/sampler.h"
#include "cuda/backend_impl.h"
#include "cuda/handoff.h"
#include "host/dtype.h"

namespace kvr::cuda {
namespace {

constexpr size_t kBatchRows = 512;  // rows per group: bounds the step's activation scratch

// Bytes appended to a host image of the step's device metadata, each array 16-byte aligned.
class MetaImage {
 public:
  size_t add(const void* p, size_t bytes) {
    const size_t off = (data_.size() + 15) / 16 * 16;
    data_.resize(off + bytes);
    if (bytes) std::memcpy(data_.data() + off, p, bytes);
    return off;
  }
  template <class T>
  size_t add(const std::vector<T>& v) {
    return add(v.data(), v.size() * sizeof(T));
  }
  uint8_t* at(size_t off) { return data_.data() + off; }
  size_t size() const { return data_.size(); }
  const uint8_t* data() const { return data_.data(); }

 private:
  std::vector<uint8_t> data_;
};

// One attention launch of a group: the pieces it covers and their plan, with the metadata offsets.
struct Launch {
  std::vector<uint32_t> pieces;  // indices into the group's pieces
  bp::AttnBatchPlan plan;
  size_t piece_seq = 0, slot0 = 0, blk_piece = 0, blk_row0 = 0, row_piece = 0, row_local = 0;
};

// A row whose logits leave the layers: the group row, and where they go (a host row, or a
// device sampling slot of item `item`).
struct LogitRow {
  uint32_t row = 0;
  float* host = nullptr;
  size_t item = 0;
};

}  // namespace

// The model's batched-step state: its stream, the scratch of one group and the staging buffers,
// grown on demand and reused by every step (one step at a time: batch_mu_).
struct CudaBackend::BatchCtx {
  static constexpr size_t kMaxGraphs = 16;  // decode-step graphs kept (batch sizes, sampler mixes)
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  DevBuf scratch, partial, workspace, meta, logits, sample;
  PinnedBuf meta_host, logits_host, sample_host;
  // Captured decode steps by key (run_group), and the key of the last decode step run eagerly: a
  // key seen twice in a row is captured, so one-off compositions never pay for a capture.
  std::vector<std::pair<std::vector<uint64_t>, cudaGraphExec_t>> graphs;
  std::vector<uint64_t> last_key;

  cudaGraphExec_t find_graph(const std::vector<uint64_t>& key) const {
    for (const auto& g : graphs)
      if (g.first == key) return g.second;
    return nullptr;
  }
  void add_graph(std::vector<uint64_t> key, cudaGraphExec_t exec) {
    if (graphs.size() >= kMaxGraphs) drop_graphs();
    graphs.emplace_back(std::move(key), exec);
  }
  void drop_graphs() {
    for (auto& g : graphs) cudaGraphExecDestroy(g.second);
    graphs.clear();
    last_key.clear();
  }
  ~BatchCtx() {
    cudaSetDevice(device);
    if (stream) cudaStreamSynchronize(stream);
    drop_graphs();
    if (stream) cudaStreamDestroy(stream);
    if (done) cudaEventDestroy(done);
  }
};

void CudaBackend::forward_batch(BatchEntry* entries, size_t count) const {
  std::vector<Item> items(count);
  for (size_t i = 0; i < count; ++i) {
    const BatchEntry& e = entries[i];
    Item& it = items[i];
    it.s = static_cast<CudaSeq*>(e.s);
    it.tokens = e.tokens;
    it.n = e.n;
    it.pos0 = e.pos0;
    it.logits = e.logits;
    if (e.sampler != nullptr) {
      const sm::RoutePlan plan = sampler_route(*e.sampler, e.width, false);
      if (plan.route != sm::Route::kRow) {  // else the neutral layer samples the host row
        it.logits = nullptr;
        it.sampler = e.sampler;
        it.width = e.width;
        it.token_out = e.token_out;
      }
    }
  }
  run_items(items.data(), count);
  for (size_t i = 0; i < count; ++i) entries[i].sampled = items[i].sampler != nullptr;
}

void CudaBackend::run_items(Item* items, size_t count) const {
  ensure_healthy();
  use_device();
  std::lock_guard<std::mutex> lock(batch_mu_);
  if (!batch_) {
    auto c = std::make_shared<BatchCtx>();
    c->device = device_;
    ck(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    ck(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming), "cudaEventCreate");
    if (lt_) alloc_dev(c->workspace, lt::kWorkspaceBytes, "allocating the cuBLASLt workspace");
    batch_ = std::move(c);
  }
  BatchCtx& c = *batch_;
  // The step waits for whatever each sequence's stream has queued (as project_linear orders a
  // projection after its source's prefill).
  for (size_t i = 0; i < count; ++i) {
    CudaSeq& s = *items[i].s;
    if (!s.ready) ck(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming), "cudaEventCreate");
    ck(cudaEventRecord(s.ready, s.stream), "ordering the step after the sequence");
    ck(cudaStreamWaitEvent(c.stream, s.ready, 0), "ordering the step after the sequence");
  }
  std::vector<size_t> n(count);
  for (size_t i = 0; i < count; ++i) n[i] = items[i].n;
  for (const auto& group : bp::plan_groups(n.data(), count, kBatchRows)) run_group(c, items, group);
  // Later work on each sequence's stream waits for the step (it has finished: run_group ends
  // synchronised; the event keeps the ordering explicit for their kv_read, codec and projections).
  ck(cudaEventRecord(c.done, c.stream), "ordering the sequences after the step");
  for (size_t i = 0; i < count; ++i)
    ck(cudaStreamWaitEvent(items[i].s->stream, c.done, 0), "ordering the sequences after the step");
}

void CudaBackend::run_group(BatchCtx& c, Item* items, const std::vector<bp::Piece>& pieces) const {
  const size_t H = g_.hidden, I = g_.inter, qd = g_.q_dim, kvd = g_.kv_dim, ldqkv = qd + 2 * kvd, V = g_.vocab;
  const uint32_t hd = static_cast<uint32_t>(g_.head_dim), kvh = static_cast<uint32_t>(g_.kv_heads);
  const uint32_t heads = static_cast<uint32_t>(g_.heads), group = heads / kvh;
  const float eps = g_.params.rms_norm_eps;
  const LayerPlan& lp = g_.layer_plan;  // the layers' recipe (core/layer_plan.h)
  const size_t P = pieces.size();
  cudaStream_t st = c.stream;
  // A step of decodes only (the steady state of continuous batching, or one sequence's decode)
  // replays a CUDA graph: every launch reads positions, caches and block tables from the metadata,
  // so one graph serves every such step with the same rows, wanted rows and samplers (StepKey).
  bool decodes_only = P >= 1;
  uint32_t max_capacity = 0;
  for (const bp::Piece& p : pieces) {
    decodes_only = decodes_only && p.n == 1;
    max_capacity = std::max(max_capacity, items[p.entry].s->capacity);
  }

  // ---- host image of the step's metadata (block tables last: the rest has fixed offsets) ----
  std::vector<int32_t> tokens;
  std::vector<uint32_t> row_seq;
  std::vector<bp::SeqDesc> descs(P);
  std::vector<LogitRow> host_rows, sample_rows;
  MetaImage meta;
  for (size_t i = 0; i < P; ++i) {
    const bp::Piece& p = pieces[i];
    const Item& it = items[p.entry];
    bp::SeqDesc& d = descs[i];
    d.row0 = static_cast<uint32_t>(tokens.size());
    d.n = p.n;
    d.pos0 = static_cast<uint32_t>(it.pos0 + p.offset);
    d.kv = kv_view(*it.s, nullptr);
    for (uint32_t r = 0; r < p.n; ++r) {
      tokens.push_back(it.tokens[p.offset + r]);
      row_seq.push_back(static_cast<uint32_t>(i));
    }
    if (it.logits != nullptr && it.all_positions) {
      for (uint32_t r = 0; r < p.n; ++r) host_rows.push_back({d.row0 + r, it.logits + (p.offset + r) * V, p.entry});
    } else if (it.logits != nullptr && p.last) {
      host_rows.push_back({d.row0 + p.n - 1, it.logits, p.entry});
    } else if (it.sampler != nullptr && p.last) {
      sample_rows.push_back({d.row0 + p.n - 1, nullptr, p.entry});
    }
  }
  const uint32_t R = static_cast<uint32_t>(tokens.size());
  // Attention: the decodes in one launch, the longer pieces in another (rows per warp 1 vs 4).
  // A graph fixes its split count from the largest capacity (as the decode graph does).
  Launch launches[2];
  for (size_t i = 0; i < P; ++i) launches[pieces[i].n == 1 ? 0 : 1].pieces.push_back(static_cast<uint32_t>(i));
  size_t partial_floats = 0;
  for (Launch& L : launches) {
    if (L.pieces.empty()) continue;
    std::vector<uint32_t> ln, lctx;
    for (uint32_t i : L.pieces) {
      ln.push_back(descs[i].n);
      lctx.push_back(decodes_only ? max_capacity : descs[i].pos0 + descs[i].n);
    }
    L.plan = bp::plan_batch_attention(ln.data(), lctx.data(), ln.size(), group, kvh, hd, sm_count_);
    partial_floats = std::max(partial_floats, L.plan.partial_floats);
    L.piece_seq = meta.add(L.pieces);
    L.slot0 = meta.add(L.plan.slot0);
    L.blk_piece = meta.add(L.plan.blk_piece);
    L.blk_row0 = meta.add(L.plan.blk_row0);
    L.row_piece = meta.add(L.plan.row_piece);
    L.row_local = meta.add(L.plan.row_local);
  }
  const size_t tok_off = meta.add(tokens), row_seq_off = meta.add(row_seq);
  std::vector<uint32_t> lrows;  // host rows first, then rows sampled on the device
  for (const LogitRow& r : host_rows) lrows.push_back(r.row);
  for (const LogitRow& r : sample_rows) lrows.push_back(r.row);
  const size_t lrows_off = meta.add(lrows);
  const size_t desc_off = meta.add(descs);  // table pointers patched below, once meta is placed
  std::vector<size_t> table_off(P, 0);
  for (size_t i = 0; i < P; ++i) {
    const CudaSeq& s = *items[pieces[i].entry].s;
    if (!s.paged()) continue;
    // the blocks holding [0, pos0 + n): reserved by the neutral layer
    const size_t bt = s.pool->blocks.tokens_per_block;
    const size_t blocks = (static_cast<size_t>(descs[i].pos0) + descs[i].n + bt - 1) / bt;
    if (blocks > s.table.size()) throw BackendError(KVR_ERR_INTERNAL, "batched step: blocks not reserved");
    table_off[i] = meta.add(s.table.data(), blocks * sizeof(uint32_t));
  }
  const size_t logit_cap = std::max<size_t>(1, std::min<size_t>(lrows.size(), kLogitBytes / (V * sizeof(float))));
  const bool graph = decodes_only && lrows.size() <= logit_cap;  // one lm_head slice inside the graph

  // ---- device buffers (grown on demand; the stream is idle between groups). A buffer that moves
  // invalidates the captured graphs (their launches hold its address).
  auto grow_dev = [&](DevBuf& b, size_t bytes, const char* what) {
    if (b.bytes >= bytes) return;
    c.drop_graphs();
    if (b.p) cudaFree(b.p);
    b.p = nullptr;
    b.bytes = 0;
    alloc_dev(b, bytes, what);
  };
  grow_dev(c.scratch, scratch_layout(nullptr, R).floats * sizeof(float), "allocating batch scratch");
  grow_dev(c.partial, std::max<size_t>(partial_floats, 1) * sizeof(float), "allocating attention partials");
  // metadata with room to spare: block tables grow step by step and would move it
  if (c.meta.bytes < meta.size()) grow_dev(c.meta, 2 * meta.size() + 4096, "allocating batch metadata");
  grow_pinned(c.meta_host, c.meta.bytes, "allocating pinned batch metadata");
  if (!lrows.empty()) grow_dev(c.logits, logit_cap * V * sizeof(float), "allocating batch logits");
  if (!host_rows.empty())
    grow_pinned(c.logits_host, std::min(logit_cap, host_rows.size()) * V * sizeof(float), "allocating pinned logits");
  const size_t scratch_off = sample_rows.size() * kSampleScratchOffset;  // [SampleOut slots | scratch]
  if (!sample_rows.empty()) {
    grow_dev(c.sample, scratch_off + sample_scratch_bytes(static_cast<uint32_t>(V)), "allocating sampling scratch");
    grow_pinned(c.sample_host, scratch_off, "allocating pinned sampling staging");
  }

  uint8_t* dmeta = static_cast<uint8_t*>(c.meta.p);
  auto* hdesc = reinterpret_cast<bp::SeqDesc*>(meta.at(desc_off));
  for (size_t i = 0; i < P; ++i)
    if (items[pieces[i].entry].s->paged()) hdesc[i].kv.table = reinterpret_cast<const uint32_t*>(dmeta + table_off[i]);
  std::memcpy(c.meta_host.p, meta.data(), meta.size());
  ck(cudaMemcpyAsync(dmeta, c.meta_host.p, meta.size(), cudaMemcpyHostToDevice, st), "copying batch metadata");
  auto dptr = [&](size_t off) { return reinterpret_cast<const uint32_t*>(dmeta + off); };
  const auto* d_desc = reinterpret_cast<const bp::SeqDesc*>(dmeta + desc_off);

  // ---- the layers over all R rows ----
  const Scratch sc = scratch_layout(c.scratch.p, R);
  float *x = sc.x, *h = sc.h, *qkv = sc.qkv, *att = sc.att, *gu = sc.gu;
  void* ws = c.workspace.p;
  auto enqueue_layers = [&] {
    launched(launch_embed(reinterpret_cast<const int32_t*>(dmeta + tok_off), R, embed_, embed_bf16_,
                    static_cast<uint32_t>(H), x, st),
       "embed launch", st);
    for (size_t l = 0; l < g_.layers; ++l) {
      const DevLayer& L = layers_[l];
      const float* gate_up_bias = lp.mlp_bias ? L.gate_up_bias : nullptr;
      // One row (a lone decode): the RMSNorm rides in the GEMV's prologue (one launch, no pass over h).
      if (R == 1) {
        launched(launch_norm_gemv(L.qkv, x, L.attn_norm, eps, nullptr, qkv, false, st), "gemv launch", st);
      } else {
        launched(launch_rmsnorm(x, H, h, H, L.attn_norm, R, static_cast<uint32_t>(H), eps, st), "rmsnorm launch", st);
        project(st, ws, sc, h, H, R, L.qkv, nullptr, qkv, ldqkv, false);
      }
      QkvPostArgs q;
      q.qkv = qkv;
      q.ldqkv = static_cast<uint32_t>(ldqkv);
      q.n = R;
      q.bias = lp.qkv_bias ? L.qkv_bias : nullptr;
      q.q_norm = lp.qk_norm ? L.q_norm : nullptr;
      q.k_norm = lp.qk_norm ? L.k_norm : nullptr;
      q.inv_freq = inv_freq_;
      q.heads = heads;
      q.kv_heads = kvh;
      q.head_dim = hd;
      q.eps = eps;
      q.kv_dtype = g_.kv_dtype();
      q.seqs = d_desc;
      q.row_seq = dptr(row_seq_off);
      q.layer = static_cast<uint32_t>(l);
      launched(launch_qkv_post(q, st), "qkv_post launch", st);
      for (const Launch& La : launches) {
        if (La.pieces.empty()) continue;
        BatchAttnArgs a;
        a.q = qkv;
        a.ldq = static_cast<uint32_t>(ldqkv);
        a.out = att;
        a.ldo = static_cast<uint32_t>(qd);
        a.seqs = d_desc;
        a.piece_seq = dptr(La.piece_seq);
        a.slot0 = dptr(La.slot0);
        a.blk_piece = dptr(La.blk_piece);
        a.blk_row0 = dptr(La.blk_row0);
        a.row_piece = dptr(La.row_piece);
        a.row_local = dptr(La.row_local);
        a.layer = static_cast<uint32_t>(l);
        a.heads = heads;
        a.kv_heads = kvh;
        a.head_dim = hd;
        a.kv_dtype = g_.kv_dtype();
        a.total_rows = La.plan.total_rows;
        a.partial = static_cast<float*>(c.partial.p);
        launched(launch_batch_attention(a, La.plan.blocks, La.plan.rows_per_warp, La.plan.splits, st),
           "attention launch", st);
      }
      project(st, ws, sc, att, qd, R, L.o, lp.o_bias ? L.o_bias : nullptr, x, H, true);
      if (R == 1) {
        launched(launch_norm_gemv(L.gate_up, x, L.mlp_norm, eps, gate_up_bias, gu, false, st), "gemv launch", st);
      } else {
        launched(launch_rmsnorm(x, H, h, H, L.mlp_norm, R, static_cast<uint32_t>(H), eps, st), "rmsnorm launch", st);
        project(st, ws, sc, h, H, R, L.gate_up, gate_up_bias, gu, 2 * I, false);
      }
      launched(launch_swiglu(gu, R, static_cast<uint32_t>(I), st), "swiglu launch", st);
      project(st, ws, sc, gu, 2 * I, R, L.down, lp.mlp_bias ? L.down_bias : nullptr, x, H, true);
    }
  };

  // ---- final norm + lm_head for rows [r0, r0 + rows) of lrows; device sampling of its sampled rows ----
  const uint32_t* d_lrows = dptr(lrows_off);
  float* dl = static_cast<float*>(c.logits.p);
  uint8_t* dsample = static_cast<uint8_t*>(c.sample.p);
  auto enqueue_head = [&](size_t r0, size_t rows) {
    if (R == 1) {  // the one row: norm in the lm_head GEMV's prologue
      launched(launch_norm_gemv(lm_head_, x, final_norm_, eps, nullptr, dl, false, st), "gemv launch", st);
    } else {
      launched(launch_rmsnorm_rows(x, H, d_lrows + r0, h, H, final_norm_, static_cast<uint32_t>(rows),
                             static_cast<uint32_t>(H), eps, st),
         "rmsnorm launch", st);
      project(st, ws, sc, h, H, static_cast<uint32_t>(rows), lm_head_, nullptr, dl, V, false);
    }
    for (size_t k = std::max(r0, host_rows.size()); k < r0 + rows; ++k) {
      const size_t slot = k - host_rows.size();
      const Item& it = items[sample_rows[slot].item];
      const kvr_sampler& smp = *it.sampler;
      const sm::RoutePlan plan = sampler_route(smp, it.width, false);
      auto* d = reinterpret_cast<SampleOut*>(dsample + slot * kSampleScratchOffset);
      launched(launch_sample_reduce(dl + (k - r0) * V, it.width, plan.route == sm::Route::kTopK ? plan.k : 0, &d->token,
                              d->ids, d->vals, &d->count, dsample + scratch_off, st),
         "sampling launch", st);
    }
  };
  // Copies the host rows of slice [r0, r0 + rows) out (synchronises).
  auto copy_host_rows = [&](size_t r0, size_t rows) {
    const size_t host_n = r0 < host_rows.size() ? std::min(rows, host_rows.size() - r0) : 0;
    if (host_n == 0) return;
    ck(cudaMemcpyAsync(c.logits_host.p, dl, host_n * V * sizeof(float), cudaMemcpyDeviceToHost, st), "copying logits");
    ck(cudaStreamSynchronize(st), "batch step");
    for (size_t k = 0; k < host_n; ++k)
      std::memcpy(host_rows[r0 + k].host, static_cast<const float*>(c.logits_host.p) + k * V, V * sizeof(float));
  };

  if (graph) {
    // What the graph's launches bake in besides buffer addresses (dropped when one moves): the rows,
    // the attention split count, which rows leave the layers and how each sampled row is reduced.
    std::vector<uint64_t> key{R, launches[0].plan.splits, host_rows.size()};
    key.insert(key.end(), lrows.begin(), lrows.end());
    for (const LogitRow& r : sample_rows) {
      const Item& it = items[r.item];
      const sm::RoutePlan plan = sampler_route(*it.sampler, it.width, false);
      key.push_back((static_cast<uint64_t>(it.width) << 32) | (static_cast<uint64_t>(plan.route) << 16) | plan.k);
    }
    auto enqueue = [&] {
      enqueue_layers();
      if (!lrows.empty()) enqueue_head(0, lrows.size());
    };
    cudaGraphExec_t exec = c.find_graph(key);
    if (exec == nullptr && key == c.last_key) {  // the second such step in a row: capture it
      ck(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      cudaGraph_t g = nullptr;
      try {
        enqueue();
      } catch (...) {
        cudaStreamEndCapture(st, &g);
        if (g) cudaGraphDestroy(g);
        throw;
      }
      ck(cudaStreamEndCapture(st, &g), "cudaStreamEndCapture");
      const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
      cudaGraphDestroy(g);
      ck(e, "cudaGraphInstantiate");
      c.add_graph(std::move(key), exec);
    }
    if (exec != nullptr) {
      ck(cudaGraphLaunch(exec, st), "cudaGraphLaunch");
    } else {
      enqueue();
      c.last_key = std::move(key);
    }
    copy_host_rows(0, lrows.size());
  } else {
    enqueue_layers();
    for (size_t r0 = 0; r0 < lrows.size(); r0 += logit_cap) {
      const size_t rows = std::min(logit_cap, lrows.size() - r0);
      enqueue_head(r0, rows);
      copy_host_rows(r0, rows);
    }
  }
  if (!sample_rows.empty())
    ck(cudaMemcpyAsync(c.sample_host.p, dsample, scratch_off, cudaMemcpyDeviceToHost, st),
       "copying the sampled candidates");
  ck(cudaStreamSynchronize(st), "batch step");

  // ---- the draws (same as forward_sample: the host sampler over the device's candidates) ----
  for (size_t slot = 0; slot < sample_rows.size(); ++slot) {
    Item& it = items[sample_rows[slot].item];
    const kvr_sampler& smp = *it.sampler;
    const sm::RoutePlan plan = sampler_route(smp, it.width, false);
    const auto& o = *reinterpret_cast<const SampleOut*>(static_cast<const uint8_t*>(c.sample_host.p) +
                                                        slot * kSampleScratchOffset);
    int32_t status;
    if (plan.route == sm::Route::kGreedy) {
      const int32_t id = o.token;
      status = sampler_run_candidates(it.sampler, plan.route, nullptr, &id, id < 0 ? 0 : 1, it.width, it.token_out);
    } else {
      const size_t m = std::min<size_t>(o.count, plan.k);
      status = sampler_run_candidates(it.sampler, plan.route, o.vals, o.ids, m, it.width, it.token_out);
    }
    it.sample_status = status;
    if (status != KVR_OK) *it.token_out = -1;
  }
}

bp::KvView CudaBackend::kv_view(const CudaSeq& s, const uint32_t* d_table) const {
  bp::KvView v;
  if (!s.paged()) {
    v.base = s.kv.p;
    v.span = s.capacity;
    return v;
  }
  const KvPool& kp = s.pool->blocks;
  v.base = s.pool->arena.p;
  v.table = d_table;
  v.span = static_cast<uint32_t>(kp.tokens_per_block);
  v.shift = static_cast<uint32_t>(__builtin_ctzll(kp.tokens_per_block));
  v.block_elems = kp.bytes_per_block / kp.elem;
  return v;
}

}  // namespace kvr::cuda
