// The CUDA backend's internal declarations (not an API): the device buffers, the per-sequence
// state (contiguous cache or a block table into a device KV pool), the paged pool and the backend
// class, shared by cuda_backend.cpp (weights, forward, KV copies, sampling), batch_step.cpp (the
// batched step) and kv_pool.cpp (the paged pool). Included by g++-compiled files only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/batch_plan.h"
#include "common/sample_math.h"
#include "core/backend.h"
#include "core/kv_pool.h"
#include "cuda/codec_host.h"
#include "cuda/cublaslt.h"
#include "cuda/kernels.h"
#include "kvrelay_test.h"  // KVR_DEBUG_* flags of kvr_model_set_debug

namespace kvr::cuda {

constexpr size_t kLogitBytes = 64u << 20;  // device/pinned logits staging of a batched step

// Device (cudaFree) or pinned host (cudaFreeHost) memory owned by RAII.
template <cudaError_t (*Free)(void*)>
struct CudaMem {
  void* p = nullptr;
  size_t bytes = 0;
  CudaMem() = default;
  CudaMem(const CudaMem&) = delete;
  CudaMem& operator=(const CudaMem&) = delete;
  ~CudaMem() {
    if (p) Free(p);
  }
};
using DevBuf = CudaMem<cudaFree>;
using PinnedBuf = CudaMem<cudaFreeHost>;

struct DevLayer {
  const float* attn_norm = nullptr;
  const float* mlp_norm = nullptr;
  const float* q_norm = nullptr;  // Qwen3
  const float* k_norm = nullptr;
  DevMatrix qkv, o, gate_up, down;
  const float* qkv_bias = nullptr;
  const float* o_bias = nullptr;
  const float* gate_up_bias = nullptr;
  const float* down_bias = nullptr;
};

class CudaBackend;

// What a device sampling step copies back (forward_sample): the greedy token or the best `count`
// candidates in order — at most 520 bytes instead of the (vocab) f32 row.
struct SampleOut {
  int32_t token;
  uint32_t count;
  int32_t ids[sm::kMaxCandidates];
  float vals[sm::kMaxCandidates];
};
constexpr size_t kSampleScratchOffset = 1024;
static_assert(sizeof(SampleOut) <= kSampleScratchOffset, "sample staging layout");

// A paged KV pool on the device (kv_pool.cpp): `blocks` keeps the free list and the geometry (its
// host `data` stays null), `arena` holds n_blocks blocks laid out like the CPU pool's
// ((layer, {K,V}, kv_head, block_tokens, head_dim) in kv_dtype), zeroed at creation.
struct CudaPool final : PoolState {
  KvPool blocks;
  DevBuf arena;
  int device = 0;
  ~CudaPool() override { cudaSetDevice(device); }  // the arena is freed on its device
  uint32_t blocks_total() const override { return blocks.blocks_total(); }
  uint32_t blocks_free() const override { return blocks.blocks_free(); }
  uint32_t block_tokens() const override { return blocks.block_tokens(); }
  uint64_t block_bytes() const override { return blocks.block_bytes(); }
  KvPool& block_list() override { return blocks; }
};

struct CudaSeq final : SeqState {
  const CudaBackend* b = nullptr;
  int device = 0;
  uint32_t capacity = 0;
  cudaStream_t stream = nullptr;
  DevBuf kv;        // contiguous: (layer, {K,V}, kv_head, pos, dim) in kv_dtype; empty when paged
  std::shared_ptr<CudaPool> pool;  // paged: position p lives in block table[p / block_tokens]
  std::vector<uint32_t> table;     // paged: block ids held (host copy; uploaded with each step)
  cudaEvent_t ready = nullptr;     // orders this stream against batched steps (batch_step.cpp)
  DevBuf stage;    // paged: one snapshot chunk in the contiguous layout (device codec), on demand
  DevBuf d_table;  // paged: the block table on the device (snapshot chunks), on demand
  PinnedBuf kv_host;  // kv_read/kv_write staging, grown on demand
  std::unique_ptr<CodecStaging> codec;  // snapshot chunk codec staging (codec_host.cpp), on demand
  bool paged() const { return pool != nullptr; }
  ~CudaSeq() override {
    cudaSetDevice(device);
    if (stream) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
    if (ready) cudaEventDestroy(ready);
    if (pool) pool->blocks.release(table.data(), table.size());  // no work on them is queued now
  }
};

// A sequence's cache as the projection and fit kernels see it, slab by slab (cuda_backend.cpp
// slab_*): a contiguous cache directly; a paged one through `stage` (kSlabTokens positions in the
// contiguous layout, DevKv.first = the slab's start), copied from / to its blocks by launch_kv_copy.
struct SlabIo {
  static constexpr uint32_t kSlabTokens = 256;
  const CudaSeq* s = nullptr;
  const CudaBackend* b = nullptr;  // the sequence's backend (this one or another on the device)
  DevBuf stage, table;
  bp::KvView view;  // paged: the blocks, table on the device
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelGeometry& g, const TensorTable& t, int32_t device);
  ~CudaBackend() override { cudaSetDevice(device_); }  // bufs_ are freed on this device

  uint32_t kind() const override { return KVR_BACKEND_CUDA; }
  std::string device_description() const override { return desc_; }
  uint64_t weight_bytes() const override { return weight_bytes_; }
  std::unique_ptr<SeqState> create_seq(uint32_t capacity) const override;
  void forward(SeqState& s, const int32_t* tokens, size_t n, size_t pos0, bool all_positions,
               float* logits) const override;
  void kv_read(const SeqState& s, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype, void* k_out,
               void* v_out) const override;
  void kv_write(SeqState& s, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype, const void* k_in,
                const void* v_in) const override;
  // The snapshot codec on the device (codec.cu, codec_host.cpp): same bytes as the host codec.
  void export_chunk(const SeqState& s, const ChunkSpec& c, uint8_t* frame, size_t frame_len) const override;
  void import_chunk(SeqState& s, const ChunkSpec& c, const uint8_t* frame, size_t frame_len) const override;
  // Projection between two sequences on this device (projector.cu + the fallback GEMM).
  bool project_linear(const SeqState& src, const Backend& src_backend, SeqState& dst, const LinearProjection& p,
                      uint32_t n_tokens) const override;
  // Fit statistics on the device when both sequences live on it (fit.cu), else the host path.
  void accumulate_fit(const SeqState& dst, const FitRequest& r) const override;
  // Greedy / top-k steps pick on the device and copy back ≤ 64 candidates; other steps copy the
  // row (sm::plan_route).
  int32_t forward_sample(SeqState& s, int32_t token, size_t pos0, const SampleRequest& r,
                         float* spare) const override;
  // Paged KV pool on the device (kv_pool.cpp): same block accounting as the CPU pool.
  std::shared_ptr<PoolState> create_pool(uint32_t n_blocks, uint32_t block_tokens) const override;
  std::unique_ptr<SeqState> create_paged_seq(const std::shared_ptr<PoolState>& pool,
                                             uint32_t capacity) const override;
  void reserve(SeqState& s, size_t from, size_t tokens) const override;
  PagedView paged(SeqState& s) const override;
  void shrink(SeqState& s, size_t tokens) const override;
  uint32_t blocks_held(const SeqState& s) const override;
  // The batched step (batch_step.cpp): one GEMM per projection over every row of the batch,
  // attention of all pieces of one kind in one launch, device sampling for greedy / top-k rows.
  void forward_batch(BatchEntry* entries, size_t count) const override;
  void set_debug(uint32_t flags) const override { debug_.store(flags); }
  std::string failure() const override {
    if (!failed_.load()) return {};
    std::lock_guard<std::mutex> lock(fail_mu_);
    return fail_msg_;
  }

 private:
  // Per-sequence activation scratch for n tokens, every buffer 256-byte aligned.
  struct Scratch {
    float *x, *h, *qkv, *att, *gu;
    uint16_t *split_hi, *split_lo;
    size_t floats;
  };
  // Host threads of a sequence's codec copies: the model's CPU threads, at most 8 (a few threads
  // saturate host memory bandwidth).
  int codec_copy_threads() const { return std::min(8, std::max(1, g_.n_threads)); }
  // Allocates `bytes` of device memory into an empty `b`.
  void alloc_dev(DevBuf& b, size_t bytes, const char* what) const;
  // Makes `b` hold at least `bytes` of pinned host memory (contents not kept).
  void grow_pinned(PinnedBuf& b, size_t bytes, const char* what) const;
  // Makes work queued on `after` from now on wait for the work queued on `before` so far (an
  // event; no host wait).
  void order_after(cudaStream_t before, cudaStream_t after, const char* what) const;
  // Throws BackendError for e != cudaSuccess; a sticky error marks the backend failed first.
  void ck(cudaError_t e, const char* what) const;
  // ck() for a launch on `st` (a kernel's launch status, a cuBLASLt call's mapped status); with
  // KVR_DEBUG_SYNC_LAUNCHES also waits for it outside graph capture, so an execution fault is
  // reported as `what`'s.
  void launched(cudaError_t e, const char* what, cudaStream_t st) const;
  // The codec's status callback: launched() on st.
  CodecStaging::Check checker(cudaStream_t st) const {
    return [this, st](cudaError_t e, const char* w) { launched(e, w, st); };
  }
  // cuBLASLt for the multi-row projections, or null: absent, or KVR_DEBUG_FALLBACK_GEMM.
  lt::CublasLt* gemm_lt() const { return (debug_.load() & KVR_DEBUG_FALLBACK_GEMM) ? nullptr : lt_; }
  void ensure_healthy() const;
  void use_device() const { ck(cudaSetDevice(device_), "cudaSetDevice"); }
  const void* upload(const void* host, size_t bytes, const char* what);
  const float* upload_f32(const TensorView* t, const char* what);
  DevMatrix upload_matrix(std::initializer_list<const TensorView*> parts, const char* what);
  const float* upload_bias(std::initializer_list<const TensorView*> parts, const char* what);
  // One sequence's part of run_items: tokens at pos0.., logits of its last row (logit_rows 1) or of
  // every row (logit_rows n) to host `logits` (null: none), or a device-sampled last row.
  struct Item {
    CudaSeq* s = nullptr;
    const int32_t* tokens = nullptr;
    size_t n = 0, pos0 = 0;
    float* logits = nullptr;
    bool all_positions = false;
    kvr_sampler* sampler = nullptr;  // device sampling (plan_route not kRow); logits then null
    uint32_t width = 0;
    int32_t* token_out = nullptr;
    int32_t sample_status = 0;  // out: the sampler's status (KVR_OK or its error; token_out -1 then)
  };
  struct BatchCtx;  // batch_step.cpp: the model's batched-step stream, scratch and staging
  void project(cudaStream_t st, void* workspace, const Scratch& sc, const float* a, size_t lda, uint32_t m,
               const DevMatrix& w, const float* bias, float* c, size_t ldc, bool accumulate) const;
  // The batched forward over items (distinct sequences, storage reserved), on the batch stream.
  void run_items(Item* items, size_t count) const;
  // One group of run_items (at most kBatchRows rows; bp::plan_groups), ending synchronised.
  void run_group(BatchCtx& c, Item* items, const std::vector<bp::Piece>& pieces) const;
  // SlabIo: binds io to s (of backend b) and uploads a paged table on st; the DevKv to read
  // positions [start, start + m) from (a paged slab is copied into the stage first); the DevKv to
  // write them to; and the write-back of a paged slab's stage into its blocks.
  void slab_open(SlabIo& io, const CudaSeq& s, const CudaBackend& b, cudaStream_t st) const;
  DevKv slab_read(SlabIo& io, uint32_t start, uint32_t m, cudaStream_t st) const;
  DevKv slab_target(SlabIo& io, uint32_t start) const;
  void slab_write(SlabIo& io, uint32_t start, uint32_t m, cudaStream_t st) const;
  // The cache of s as the kernels address it; d_table: the device copy of a paged table.
  bp::KvView kv_view(const CudaSeq& s, const uint32_t* d_table) const;
  // A paged sequence's snapshot chunk of `tokens` positions: grows s.stage to hold them in the
  // contiguous layout (capacity = tokens) and uploads the block table to s.d_table (on s.stream);
  // returns the stage as the device codec addresses it and sets *paged to the sequence's view.
  DevKv chunk_stage(CudaSeq& s, uint32_t tokens, bp::KvView* paged, bp::KvView* staged) const;
  // Calls fn(pos, len, k_dev, v_dev, pitch) for each run of positions [start, start + count) of a
  // layer that is contiguous per kv head (the whole range when contiguous; block by block when
  // paged); k_dev/v_dev point at kv head 0, heads `pitch` bytes apart.
  template <class Fn>
  void kv_runs(const CudaSeq& s, uint32_t layer, uint32_t start, uint32_t count, Fn fn) const;
  uint8_t* kv_layer(const CudaSeq& s, size_t layer, bool v) const;
  Scratch scratch_layout(void* base, size_t n) const;

  ModelGeometry g_;
  int32_t device_ = 0;
  uint32_t sm_count_ = 1;
  std::string desc_;
  uint64_t weight_bytes_ = 0;
  std::vector<std::unique_ptr<DevBuf>> bufs_;
  const void* embed_ = nullptr;
  bool embed_bf16_ = false;
  const float* final_norm_ = nullptr;
  DevMatrix lm_head_;
  std::vector<DevLayer> layers_;
  const double* inv_freq_ = nullptr;
  lt::CublasLt* lt_ = nullptr;  // null when absent: the mma.sync fallback GEMM runs instead

  mutable std::mutex batch_mu_;               // one batched step at a time per model
  mutable std::shared_ptr<BatchCtx> batch_;  // created by the first batched step

  mutable std::atomic<uint32_t> debug_{0};  // KVR_DEBUG_* (kvr_model_set_debug)
  mutable std::atomic<bool> failed_{false};
  mutable std::mutex fail_mu_;
  mutable std::string fail_msg_;
};

}  // namespace kvr::cuda
