// The backend seam: what a compute backend (CPU in native/src/cpu/, CUDA in native/src/cuda/)
// implements behind the neutral model and sequence (model.h, sequence.h). The neutral layer owns
// params, geometry, RoPE frequencies, lengths, messages and ALL argument validation; a backend
// gets only validated calls and owns its weights, per-sequence KV cache and scratch.
// Not a C ABI (kvrelay.h), not a plugin interface: backends are linked in.
//
// Errors: a backend throws kvr::BackendError{status, message} (a kvr_status; out of device or
// host memory is KVR_ERR_OUT_OF_MEMORY) or std::bad_alloc; the neutral layer catches, records the
// message on the sequence / thread and returns the status. Nothing else may escape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/chunk_layout.h"
#include "core/layer_plan.h"
#include "kvrelay.h"

namespace kvr {

struct KvPool;  // kv_pool.h: the block list and reference counts every pool keeps
struct KvCache;  // kv_cache.h: a sequence's KV planes in host memory

// A status with its message, thrown by backends (see the file comment).
class BackendError : public std::exception {
 public:
  BackendError(int32_t status, std::string message) : status(status), message(std::move(message)) {}
  const char* what() const noexcept override { return message.c_str(); }
  int32_t status;  // a kvr_status (< 0)
  std::string message;
};

// Validated geometry shared by every backend (built by the neutral loader, immutable).
struct ModelGeometry {
  kvr_model_params params{};  // validated; n_threads resolved (>= 1)
  int n_threads = 1;          // CPU worker threads (params.n_threads resolved)
  size_t vocab = 0, hidden = 0, inter = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  size_t q_dim = 0, kv_dim = 0;  // heads*head_dim, kv_heads*head_dim
  // RoPE inverse frequencies after rope_scaling (head_dim/2 of them), radians per position;
  // angle of pair d at position p = p * inv_freq[d] computed in double (rope.h).
  std::vector<double> inv_freq;
  LayerPlan layer_plan;  // the layers' recipe (layer_plan.h), read by both backends
  uint32_t kv_dtype() const { return params.kv_dtype; }
};

// One validated tensor-table row. `data` points into the read-only mmapped checkpoint and is
// valid ONLY while the backend is being constructed (make_*_backend): copy or upload from it.
struct TensorView {
  uint32_t role = 0;   // kvr_tensor_role
  uint32_t layer = 0;  // 0 for global roles
  uint32_t dtype = 0;  // kvr_dtype of the stored elements
  uint64_t rows = 0;   // shape[0]
  uint64_t cols = 1;   // shape[1] (1 for 1-D tensors)
  uint64_t nbytes = 0; // rows * cols * dtype size
  const void* data = nullptr;  // little-endian elements, row-major, any alignment
};

// The validated tensor table: every required tensor present once with the shape its role needs
// (kvrelay.h kvr_tensor_role comments), optional ones (biases, q/k norms, lm_head when untied)
// present exactly when the params say so.
class TensorTable {
 public:
  static constexpr uint32_t kRoles = 28;  // roles are < 28
  explicit TensorTable(size_t layers) : slot_((layers + 1) * kRoles, -1) {}
  // The row for (role, layer), or nullptr when absent (global roles: layer 0).
  const TensorView* find(uint32_t role, size_t layer = 0) const {
    const long i = slot_[index(role, layer)];
    return i < 0 ? nullptr : &rows_[static_cast<size_t>(i)];
  }
  // Loader side: adds a row (the caller has checked it and that the slot is free).
  void add(const TensorView& t) {
    slot_[index(t.role, t.layer)] = static_cast<long>(rows_.size());
    rows_.push_back(t);
  }
  const std::vector<TensorView>& rows() const { return rows_; }

 private:
  static bool global(uint32_t role) { return role < 10; }
  size_t index(uint32_t role, size_t layer) const { return (global(role) ? 0 : layer + 1) * kRoles + role; }
  std::vector<long> slot_;
  std::vector<TensorView> rows_;
};

// Per-sequence backend state: the KV cache of `capacity` positions for every layer plus scratch.
// Opaque to the neutral layer (which keeps the length); destroyed before its Backend.
class SeqState {
 public:
  virtual ~SeqState() = default;
};

// One snapshot chunk of a sequence (kvr_seq_export_chunk / kvr_seq_import_chunk), validated by the
// neutral layer: layout.encoding a kvr_kv_encoding, layout.group the q4 group (0 otherwise),
// layout.tokens >= 1, the model's layers/heads/dim; frame_len = layout.frame_bytes().
struct ChunkSpec {
  chunk::Layout layout;
  uint32_t index = 0;        // stored in the frame
  uint32_t start = 0;        // cache position of the chunk's first token
  uint32_t cache_dtype = 0;  // the sequence's kv_dtype (imported values must stay finite in it)
};

// A paged KV pool of one backend (continuous batching, docs/batching.md): a fixed arena of
// blocks of block_tokens positions, each holding every layer's K and V for its positions.
// Paged SeqStates hold block tables into it. Thread-safe counts; owned by shared_ptr (the
// kvr_kv_pool handle and every paged sequence of it).
class PoolState {
 public:
  virtual ~PoolState() = default;
  virtual uint32_t blocks_total() const = 0;
  virtual uint32_t blocks_free() const = 0;
  virtual uint32_t block_tokens() const = 0;
  virtual uint64_t block_bytes() const = 0;
  // The free list and per-block reference counts (kv_pool.h), whatever memory holds the blocks.
  virtual KvPool& block_list() = 0;
};

// A paged sequence state's pool and block table (Backend::paged); both null when contiguous.
struct PagedView {
  PoolState* pool = nullptr;
  std::vector<uint32_t>* table = nullptr;  // table[i] holds positions [i·block_tokens, (i+1)·block_tokens)
};

// One sequence's part of a batched step (Backend::forward_batch): tokens[0..n) at positions
// pos0.. (storage for them already reserved); logits: host (vocab) for its last row, or null;
// spare: host (vocab) floats a backend may overwrite (for forward(), which always writes logits).
// sampler (kvr_batch_step_sample): non-null → the neutral layer samples logits[0..width) of the
// row written to `logits` into *token_out after the step, unless the backend sampled it itself
// (on its device; same draw as kvr_sampler_sample) and set `sampled` (token_out then written,
// -1 with the message on the sampler when the row has no finite logit).
struct BatchEntry {
  SeqState* s = nullptr;
  const int32_t* tokens = nullptr;
  size_t n = 0, pos0 = 0;
  float* logits = nullptr;
  float* spare = nullptr;
  kvr_sampler* sampler = nullptr;
  uint32_t width = 0;
  int32_t* token_out = nullptr;
  bool sampled = false;
};

// A sampling decode step's request (kvr_seq_decode_sample, validated by the neutral layer): the
// sampler (settings, PRNG stream; sampler.h), 1 <= width <= vocab, and the output buffers
// (token_out non-null; top arrays non-null when top_len > 0; logprob_out / top_count_out optional).
struct SampleRequest {
  kvr_sampler* sampler = nullptr;
  uint32_t width = 0;
  int32_t* token_out = nullptr;
  double* logprob_out = nullptr;
  int32_t* top_ids = nullptr;
  double* top_logprobs = nullptr;
  uint32_t top_len = 0;
  uint32_t* top_count_out = nullptr;
  bool wants_logprobs() const { return logprob_out != nullptr || top_len > 0; }
};

class Backend;

// kvr_ridge_accumulate_seq handed to the target sequence's backend (ridge_seq.cpp): fit rows of
// positions [0, n_tokens) of two sequences — x = the source's features, y = the target's (keys
// de-rotated by each model's RoPE, values as they are; host/projection_kernels.h cache_to_features layout
// (tokens, layers·kv_heads·head_dim)) — for keys and for values, delivered through one of the
// sinks exactly once. The sinks check finiteness of everything before adding anything.
struct FitRequest {
  const SeqState* src = nullptr;        // the source sequence's state
  const Backend* src_backend = nullptr; // its backend
  const ModelGeometry* src_geom = nullptr;
  const ModelGeometry* dst_geom = nullptr;
  uint32_t n_tokens = 0;                // >= 1, <= both lengths
  int n_threads = 1;                    // host threads
  // Host rows: x (rows, n_in) / y (rows, n_out) f32 for keys (k) and values (v).
  std::function<void(const float* xk, const float* yk, const float* xv, const float* yv, size_t rows)> add_rows;
  // Statistics a device accumulated over `rows` rows, f64: g ((n_in+1)², row-major, entries i <= j;
  // index n_in = the bias column), c ((n_in+1), n_out), yy (n_out), for keys then values; `bad`:
  // a non-finite feature was seen (the sink refuses and adds nothing).
  std::function<void(const double* gk, const double* ck, const double* yyk, const double* gv, const double* cv,
                     const double* yyv, uint64_t rows, bool bad)>
      add_stats;
};

// A linear KV projector as kvr_projector_apply_seq hands it to a backend (projector.cpp): shapes,
// row-major weights on request, biases, and a slot where a device backend keeps its copy of the
// weights for the projector's lifetime (guarded by slot_mutex).
struct LinearProjection {
  size_t src_layers = 0, src_heads = 0, src_dim = 0, dst_layers = 0, dst_heads = 0, dst_dim = 0;
  // Writes W_k (keys) or W_v (n_dst, n_src) row-major f32 into out.
  std::function<void(bool keys, float* out)> weights;
  const float* bk = nullptr;  // (n_dst)
  const float* bv = nullptr;
  std::shared_ptr<void>* slot = nullptr;
  std::mutex* slot_mutex = nullptr;
};

// A model's weights on one device. Immutable after construction: every method is const and may
// run concurrently on different SeqStates (one call at a time per SeqState). Arguments are
// already validated by the neutral layer (ranges, sizes, token ids, capacity).
class Backend {
 public:
  virtual ~Backend() = default;
  // kvr_backend of this backend (KVR_BACKEND_CPU, KVR_BACKEND_CUDA).
  virtual uint32_t kind() const = 0;
  // One line naming the device this model runs on (e.g. "cpu: <model name>, 8 cores, avx2-fma").
  virtual std::string device_description() const = 0;
  // Resident bytes of the weights in compute layout (kvr_model_weight_bytes).
  virtual uint64_t weight_bytes() const = 0;
  // A sequence's state with a zeroed KV cache of `capacity` (>= 1) positions per layer, logical
  // layout per layer: K and V each (kv_heads, capacity, head_dim) in geometry.kv_dtype().
  virtual std::unique_ptr<SeqState> create_seq(uint32_t capacity) const = 0;
  // Appends tokens[0..n) (n >= 1, ids < vocab, host memory) at positions pos0..pos0+n-1
  // (pos0 + n <= capacity) and writes host f32 logits: all_positions ? (n, vocab) row-major :
  // the last position's (vocab). Positions < pos0 hold valid KV. May leave KV at positions
  // >= pos0 written on failure (the neutral length is unchanged then).
  virtual void forward(SeqState& s, const int32_t* tokens, size_t n, size_t pos0, bool all_positions,
                       float* logits) const = 0;
  // Copies positions [start, start+count) of one layer's K and V out to host buffers, each
  // (kv_heads, count, head_dim) row-major in `dtype` (a kvr_dtype): bit-exact when dtype equals
  // kv_dtype, else converted f32 → dtype rounding to nearest even. start+count <= capacity.
  virtual void kv_read(const SeqState& s, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype,
                       void* k_out, void* v_out) const = 0;
  // The inverse copy (host → cache), same layout and conversion rules; start+count <= capacity.
  virtual void kv_write(SeqState& s, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype,
                        const void* k_in, const void* v_in) const = 0;
  // Encodes chunk c (positions [start, start+tokens) < length, every layer) into the host buffer
  // frame (frame_len bytes, the unsigned frame incl. its CRC32C). Throws BackendError
  // KVR_ERR_INVALID_ARGUMENT for non-finite KV under q8/q4. The default (backend.cpp,
  // chunk_codec.h) goes through kv_read and the host quantizers; a device backend overrides it to encode in place.
  virtual void export_chunk(const SeqState& s, const ChunkSpec& c, uint8_t* frame, size_t frame_len) const;
  // Checks (CRC32C: KVR_ERR_CHECKSUM; stored index/tokens, scales, mins, then every decoded value
  // finite in its stored type and in the cache type: KVR_ERR_CORRUPT) and then writes chunk c
  // from the host frame into positions [start, start+tokens) of every layer (start+tokens <=
  // capacity); writes nothing when a check fails. The neutral layer sets length.
  virtual void import_chunk(SeqState& s, const ChunkSpec& c, const uint8_t* frame, size_t frame_len) const;
  // ---- Paged KV and batched steps (continuous batching, docs/batching.md) ----
  // For a backend without them (the defaults): pools are KVR_ERR_UNSUPPORTED, reserve/shrink are
  // no-ops (contiguous caches) and forward_batch runs forward() per entry.
  // A pool of n_blocks (>= 1) blocks of block_tokens (power of two in [8, 1024]) positions.
  virtual std::shared_ptr<PoolState> create_pool(uint32_t n_blocks, uint32_t block_tokens) const;
  // A sequence state holding no block yet, growing in `pool` (created by this backend) up to
  // `capacity` positions.
  virtual std::unique_ptr<SeqState> create_paged_seq(const std::shared_ptr<PoolState>& pool,
                                                     uint32_t capacity) const;
  // Makes positions [0, tokens) (from <= tokens <= capacity) addressable and [from, tokens)
  // writable: a paged state takes the missing blocks from its pool and replaces each block of
  // [from, tokens) that another holder shares by a copy of it (copy on write, kv_pool.h
  // prepare_write), all or none, else throws BackendError KVR_ERR_POOL_EXHAUSTED (nothing changes
  // then). Contiguous states: no-op. Called by the neutral layer before every write, with `from`
  // the first position the write touches.
  virtual void reserve(SeqState& s, size_t from, size_t tokens) const;
  // The pool and block table of a paged state (kvr_seq_block_table, kvr_seq_adopt); {} when
  // contiguous.
  virtual PagedView paged(SeqState& s) const;
  // Gives back the blocks holding no position < tokens (truncate, set_length). Contiguous: no-op.
  virtual void shrink(SeqState& s, size_t tokens) const;
  // Blocks a paged state holds (0 for a contiguous one).
  virtual uint32_t blocks_held(const SeqState& s) const;
  // One forward step over `count` distinct sequences (validated, storage reserved): projections
  // batched over all rows, attention per sequence. Each entry's logits equal forward() of its
  // tokens up to summation order. The default (backend.cpp) calls forward() per entry.
  virtual void forward_batch(BatchEntry* entries, size_t count) const;

  // One decode step that samples: appends `token` at pos0 (like forward with n = 1; storage
  // reserved) and picks the next token from the first r.width logits of that position with
  // r.sampler, exactly as kvr_sampler_sample on that row would (same token, same PRNG advance,
  // same logprobs). Returns the sampling status (KVR_OK, or the sampler's error with the token
  // appended); backend failures throw. `spare`: host (vocab) floats the backend may overwrite.
  // The default (backend.cpp) runs forward() into spare and the CPU sampler; the CUDA backend
  // keeps the row on the device for greedy and top-k steps (common/sample_math.h plan_route).
  virtual int32_t forward_sample(SeqState& s, int32_t token, size_t pos0, const SampleRequest& r,
                                 float* spare) const;

  // Fit statistics straight from two sequences (kvr_ridge_accumulate_seq); `dst` is this
  // backend's. The default (backend.cpp, what the CPU backend runs): kv_read of every layer of
  // both → cache_to_features → r.add_rows (the CPU float64 Gram update). The CUDA backend, with
  // both sequences on its device, gathers the features and accumulates G/C/yy in f64 there
  // (fit.cu) and calls r.add_stats.
  virtual void accumulate_fit(const SeqState& dst, const FitRequest& r) const;

  // Empty while the backend is usable, else why not: a device fault (a CUDA kernel error leaves the
  // context unusable) fails every later call, and the model must be reloaded. Any thread
  // (kvr_model_health; /readyz answers 503 then).
  virtual std::string failure() const;
  // Debug switches (kvrelay_test.h kvr_model_set_debug: KVR_DEBUG_* flags, already checked); a backend
  // without the paths they select ignores them. Any thread; read by the calls that follow.
  virtual void set_debug(uint32_t flags) const;
  // Projects positions [0, n_tokens) of `src` (a sequence of `src_backend`'s model) into `dst`
  // (this backend's) and returns true, or returns false without touching anything when this
  // backend cannot do it natively (then projector.cpp takes the copy path). The CUDA backend does
  // it when both sequences live on its device (docs/gpu-handoff.md).
  virtual bool project_linear(const SeqState& src, const Backend& src_backend, SeqState& dst,
                              const LinearProjection& p, uint32_t n_tokens) const;
  // The sequence's KV cache when it lies in host memory in kv_cache.h's layout (the CPU backend's
  // sequences), else nullptr (the default). Neutral fast paths work on it in place (projector.cpp
  // projects between two such caches without copies).
  virtual KvCache* host_cache(SeqState& s) const;
};

// The CPU backend (native/src/cpu/cpu_backend.cpp): packs the weights from the table.
std::unique_ptr<Backend> make_cpu_backend(const ModelGeometry& g, const TensorTable& t);
// The CUDA backend on `device` (a CUDA ordinal), uploading the weights from the table. A build
// without CUDA links native/src/stub/cuda_stub.cpp, which throws KVR_ERR_UNSUPPORTED.
std::unique_ptr<Backend> make_cuda_backend(const ModelGeometry& g, const TensorTable& t, int32_t device);
// Probes CUDA device `device` (>= 0): KVR_OK with a one-line description in info (e.g.
// "cuda:0 NVIDIA H200, sm_90, 132 SMs, 139.8 GiB, cuBLASLt 13.0"), or a kvr_status with the
// reason in info. Convention the TypeScript tests rely on: no usable device (no driver, no GPU,
// ordinal out of range) is KVR_ERR_UNSUPPORTED with info "no CUDA device: <cuda error name>
// (<code>) <detail>"; the stub answers KVR_ERR_UNSUPPORTED "built without CUDA support (nvcc not
// found at build time)". Never throws. make_cuda_backend on such a machine throws
// BackendError with the same status and message.
int32_t cuda_probe(int32_t device, std::string& info);

}  // namespace kvr
