// The CPU backend (backend.h): packs the checkpoint's weights from the validated tensor table
// (kept as bf16 when the file's are BF16, else converted to f32; the test library's
// KVR_WEIGHTS_F32 widens them), runs cpu::forward on a per-sequence KV cache, and copies
// KV in and out with dtype conversion. Arguments arrive validated (model_load.cpp, sequence.cpp).
// Every computation enters through forward / forward_batch / forward_sample, which run under the
// model's kernel cap (params.cpu_kernel; a KernelScope on the calling thread, carried by the
// worker pool and OpenMP regions to the threads computing for it, cpu_features.h).
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <cstring>
#include <initializer_list>
#include <new>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include "core/backend.h"
#include "core/errors.h"
#include "core/kv_pool.h"
#include "core/kv_recycle.h"
#include "cpu/batch_forward.h"
#include "cpu/cpu_backend.h"
#include "cpu/forward.h"
#include "cpu/weights.h"
#include "host/convert.h"
#include "host/cpu_features.h"
#include "host/dtype.h"
#include "host/gemm.h"
#include "host/huge_pages.h"

namespace kvr::cpu {
namespace {

// Reads validated table rows into f32 / bf16 buffers and packed weights.
struct Loader {
  const TensorTable& t;

  const TensorView& row(uint32_t role, size_t layer) const { return *t.find(role, layer); }
  // Converts a row into dst (rows*cols floats).
  static void read(const TensorView& d, float* dst) {
    const uint8_t* src = static_cast<const uint8_t*>(d.data);
    const size_t n = d.rows * d.cols;
    if (d.dtype == KVR_DTYPE_F32) {
      std::memcpy(dst, src, n * 4);
    } else if (d.dtype == KVR_DTYPE_BF16) {
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
    }
  }
  // Copies a BF16 row into dst (bf16 bit patterns) unconverted.
  static void read_bf16(const TensorView& d, uint16_t* dst) {
    std::memcpy(dst, d.data, d.rows * d.cols * sizeof(uint16_t));
  }
  static bool all_bf16(std::initializer_list<const TensorView*> parts) {
    for (const TensorView* p : parts)
      if (p->dtype != KVR_DTYPE_BF16) return false;
    return true;
  }
  // Packs the parts stacked in order (each (rows_i, cols) row-major) as one weight of
  // (sum rows_i, cols): bf16 panels when keep_bf16 and every part is BF16, else f32.
  // quant: KVR_WEIGHTS_NATIVE, or Q8 / Q4 to quantize (from an f32 staging copy freed on return).
  static PackedWeight packed(std::initializer_list<const TensorView*> parts, size_t cols, bool keep_bf16,
                             uint32_t quant) {
    const bool q8 = quant != KVR_WEIGHTS_NATIVE;
    size_t rows = 0;
    for (const TensorView* p : parts) rows += p->rows;
    if (!q8 && keep_bf16 && all_bf16(parts)) {  // packed from the mapped file: no staging copy
      std::vector<PackedWeight::Bf16Rows> blocks;
      for (const TensorView* p : parts) blocks.push_back({p->data, p->rows});
      return PackedWeight::pack_bf16(blocks.data(), blocks.size(), cols);
    }
    std::vector<float> w(rows * cols);
    size_t r = 0;
    for (const TensorView* p : parts) {
      read(*p, w.data() + r * cols);
      r += p->rows;
    }
    if (quant == KVR_WEIGHTS_Q4) return PackedWeight::pack_q4(w.data(), rows, cols);
    return q8 ? PackedWeight::pack_q8(w.data(), rows, cols) : PackedWeight::pack(w.data(), rows, cols);
  }
  static std::vector<float> vec(const TensorView* d) {
    if (d == nullptr) return {};
    std::vector<float> v(d->rows * d->cols);
    read(*d, v.data());
    return v;
  }
};

// True when p may be read or written as floats in place (caller buffers come in as bytes).
bool aligned_f32(const uint8_t* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }

// Copies (kv_heads, count, head_dim) between a caller buffer in `dtype` and the cache's K
// (which = 0) or V (1) of one layer, run by run (a paged cache is contiguous within a block).
// A conversion goes straight between buffer and cache when one side is f32 (no f32 bounce).
void kv_copy(const KvCache& kv, size_t layer, size_t which, uint32_t start, uint32_t count, uint32_t dtype,
             uint8_t* buf, bool to_cache) {
  const size_t hd = kv.head_dim, bes = dtype_size(dtype);
  const size_t end = static_cast<size_t>(start) + count;
  std::vector<float> tmp;
  for (size_t g = 0; g < kv.kv_heads; ++g) {
    for (size_t p = start; p < end;) {
      const size_t len = std::min(kv.run(p), end - p);
      const size_t elems = len * hd;
      uint8_t* c = kv.at(layer, which, g, p);
      uint8_t* b = buf + (g * count + (p - start)) * hd * bes;
      if (dtype == kv.dtype) {
        if (to_cache) std::memcpy(c, b, elems * bes);
        else std::memcpy(b, c, elems * bes);
      } else if (to_cache && kv.dtype == KVR_DTYPE_F32) {  // widen straight into the f32 cache
        to_f32(b, dtype, reinterpret_cast<float*>(c), elems);
      } else if (!to_cache && dtype == KVR_DTYPE_F32 && aligned_f32(b)) {  // widen straight into the caller's f32
        to_f32(c, kv.dtype, reinterpret_cast<float*>(b), elems);
      } else if (to_cache && dtype == KVR_DTYPE_F32 && aligned_f32(b)) {  // narrow straight from the caller's f32
        from_f32(reinterpret_cast<const float*>(b), kv.dtype, c, elems);
      } else if (!to_cache && kv.dtype == KVR_DTYPE_F32) {  // narrow straight from the f32 cache
        from_f32(reinterpret_cast<const float*>(c), dtype, b, elems);
      } else {  // bf16 <-> f16 (or an unaligned f32 buffer): through f32
        if (tmp.size() < elems) tmp.resize(elems);
        if (to_cache) {
          to_f32(b, dtype, tmp.data(), elems);
          from_f32(tmp.data(), kv.dtype, c, elems);
        } else {
          to_f32(c, kv.dtype, tmp.data(), elems);
          from_f32(tmp.data(), dtype, b, elems);
        }
      }
      p += len;
    }
  }
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelGeometry& g, const TensorTable& t)
      : g_(g), cap_(static_cast<KernelCap>(g.params.cpu_kernel)) {
    const KernelScope scope(cap_);
    load(t);
#if defined(__GLIBC__)
    // The load's f32 staging copies went back to malloc's heap, where they stay resident: the
    // packed weights no longer reuse them (large ones are mapped on huge pages, huge_pages.h).
    // Measured on Qwen3-0.6B q8: process RSS after load 1026 → 973 MB.
    malloc_trim(0);
#endif
  }

  uint32_t kind() const override { return KVR_BACKEND_CPU; }
  KvCache* host_cache(SeqState& s) const override { return cpu_cache(&s); }
  std::string device_description() const override {
    const KernelScope scope(cap_);  // names the kernels this model runs
    return cpu_description() + format(", %d threads", g_.n_threads);
  }

  uint64_t weight_bytes() const override {
    auto f32 = [](const std::vector<float>& v) { return v.size() * sizeof(float); };
    uint64_t bytes = f32(w_.embed) + w_.embed_bf16.size() * sizeof(uint16_t) + f32(w_.final_norm) +
                     w_.lm_head.size_bytes();
    for (const LayerWeights& l : w_.layer) {
      bytes += f32(l.attn_norm) + f32(l.mlp_norm) + f32(l.q_norm) + f32(l.k_norm) + f32(l.qkv_bias) +
               f32(l.o_bias) + f32(l.gate_up_bias) + f32(l.down_bias) + l.qkv.size_bytes() +
               l.o.size_bytes() + l.gate_up.size_bytes() + l.down.size_bytes();
    }
    return bytes;
  }

  std::unique_ptr<SeqState> create_seq(uint32_t capacity) const override {
    const size_t es = dtype_size(g_.kv_dtype());
    const size_t bytes = 2 * g_.layers * g_.kv_heads * g_.head_dim * es * static_cast<size_t>(capacity);
    auto s = std::make_unique<CpuSeq>();
    KvCache& kv = s->kv;
    kv.dtype = g_.kv_dtype();
    kv.elem = es;
    kv.layers = g_.layers;
    kv.kv_heads = g_.kv_heads;
    kv.head_dim = g_.head_dim;
    kv.capacity = capacity;
    const KvRecycler::Buffer buf = recycler_->take(bytes);  // all-zero, like calloc
    kv.data = buf.data;
    kv.alloc_bytes = buf.bytes;
    kv.recycler = recycler_;
    if (!kv.data)
      throw BackendError(KVR_ERR_OUT_OF_MEMORY,
                         format("out of memory allocating a KV cache of %zu bytes (capacity %u, %s)", bytes,
                                capacity, dtype_name(g_.kv_dtype())));
    // Huge pages: decode attention reads the whole cache every step (Qwen3-0.6B f32 at 512
    // positions: 117 MB per token); on 4 KiB pages its step was 1.2–2 ms longer (docs/native.md).
    // A cache of at least 2 MiB then becomes resident in 2 MiB steps, so in practice whole
    // (capacity = prompt + max tokens) once decode writes every plane, as llama.cpp's
    // preallocated cache is.
    cpu::advise_huge(kv.data, bytes);
    return s;
  }

  void forward(SeqState& s, const int32_t* tokens, size_t n, size_t pos0, bool all_positions,
               float* logits) const override {
    const KernelScope scope(cap_);
    CpuSeq& c = static_cast<CpuSeq&>(s);
    cpu::forward(g_, w_, c.kv, tokens, n, pos0, all_positions, logits, c.scratch);
  }

  int32_t forward_sample(SeqState& s, int32_t token, size_t pos0, const SampleRequest& r,
                         float* spare) const override {
    const KernelScope scope(cap_);  // the step and its draw (Backend's default: forward + sampler)
    return Backend::forward_sample(s, token, pos0, r, spare);
  }

  void kv_read(const SeqState& s, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype, void* k_out,
               void* v_out) const override {
    const KvCache& kv = static_cast<const CpuSeq&>(s).kv;
    kv_copy(kv, layer, 0, start, count, dtype, static_cast<uint8_t*>(k_out), false);
    kv_copy(kv, layer, 1, start, count, dtype, static_cast<uint8_t*>(v_out), false);
  }

  void kv_write(SeqState& s, uint32_t layer, uint32_t start, uint32_t count, uint32_t dtype, const void* k_in,
                const void* v_in) const override {
    const KvCache& kv = static_cast<CpuSeq&>(s).kv;
    kv_copy(kv, layer, 0, start, count, dtype, const_cast<uint8_t*>(static_cast<const uint8_t*>(k_in)), true);
    kv_copy(kv, layer, 1, start, count, dtype, const_cast<uint8_t*>(static_cast<const uint8_t*>(v_in)), true);
  }

  std::shared_ptr<PoolState> create_pool(uint32_t n_blocks, uint32_t block_tokens) const override {
    const size_t es = dtype_size(g_.kv_dtype());
    auto pool = std::make_shared<KvPool>();
    pool->dtype = g_.kv_dtype();
    pool->elem = es;
    pool->layers = g_.layers;
    pool->kv_heads = g_.kv_heads;
    pool->head_dim = g_.head_dim;
    pool->tokens_per_block = block_tokens;
    pool->n_blocks = n_blocks;
    pool->bytes_per_block = 2 * g_.layers * g_.kv_heads * g_.head_dim * es * block_tokens;
    pool->data = static_cast<uint8_t*>(std::calloc(pool->bytes_per_block * n_blocks, 1));
    if (!pool->data)
      throw BackendError(KVR_ERR_OUT_OF_MEMORY, format("out of memory allocating a KV pool of %u blocks x %zu bytes",
                                                       n_blocks, pool->bytes_per_block));
    // As create_seq's cache: blocks are handed out low ids first, so the pool's resident memory
    // still grows with the blocks in use (2 MiB at a time).
    cpu::advise_huge(pool->data, pool->bytes_per_block * n_blocks);
    pool->init_free_list();
    return pool;
  }

  std::unique_ptr<SeqState> create_paged_seq(const std::shared_ptr<PoolState>& pool, uint32_t capacity) const override {
    auto kp = std::dynamic_pointer_cast<KvPool>(pool);
    if (!kp) throw BackendError(KVR_ERR_INVALID_ARGUMENT, "the pool belongs to another backend");
    auto s = std::make_unique<CpuSeq>();
    KvCache& kv = s->kv;
    kv.dtype = kp->dtype;
    kv.elem = kp->elem;
    kv.layers = kp->layers;
    kv.kv_heads = kp->kv_heads;
    kv.head_dim = kp->head_dim;
    kv.capacity = capacity;
    kv.pool = std::move(kp);
    return s;
  }

  void reserve(SeqState& s, size_t from, size_t tokens) const override {
    KvCache& kv = static_cast<CpuSeq&>(s).kv;
    if (kv.reserve(from, tokens)) return;
    throw BackendError(KVR_ERR_POOL_EXHAUSTED,
                       format("KV pool exhausted: %zu more block(s) of %zu tokens needed for %zu positions, %zu free",
                              kv.blocks_needed(tokens), kv.pool->tokens_per_block, tokens, kv.pool->free_count()));
  }

  void shrink(SeqState& s, size_t tokens) const override { static_cast<CpuSeq&>(s).kv.shrink(tokens); }

  PagedView paged(SeqState& s) const override {
    KvCache& kv = static_cast<CpuSeq&>(s).kv;
    if (!kv.pool) return {};
    return {kv.pool.get(), &kv.table};
  }

  uint32_t blocks_held(const SeqState& s) const override {
    return static_cast<uint32_t>(static_cast<const CpuSeq&>(s).kv.table.size());
  }

  void forward_batch(BatchEntry* entries, size_t count) const override {
    const KernelScope scope(cap_);
    thread_local BatchScratch scratch;  // per worker thread, reused across steps
    std::vector<BatchSeq> batch(count);
    for (size_t i = 0; i < count; ++i) {
      batch[i].kv = &static_cast<CpuSeq*>(entries[i].s)->kv;
      batch[i].tokens = entries[i].tokens;
      batch[i].n = entries[i].n;
      batch[i].pos0 = entries[i].pos0;
      batch[i].logits = entries[i].logits;
      batch[i].sampler = entries[i].sampler;
      batch[i].width = entries[i].width;
      batch[i].token_out = entries[i].token_out;
    }
    cpu::forward_batch(g_, w_, batch.data(), count, scratch);
    for (size_t i = 0; i < count; ++i) entries[i].sampled = batch[i].sampled;
  }

 private:
  void load(const TensorTable& t) {
    // BF16 linear weights (and the embedding) stay bf16 unless KVR_WEIGHTS_F32 widens them: the
    // kernels widen them exactly, so results are bit-identical either way, and bf16 halves the
    // memory and the bytes each decode streams.
    const kvr_model_params& p = g_.params;
    const bool keep_bf16 = p.weights != KVR_WEIGHTS_F32;
    // Linear weights (and lm_head): q8 / q4 to quantize, else as stored (or widened).
    const uint32_t quant = p.weights == KVR_WEIGHTS_F32 ? uint32_t{KVR_WEIGHTS_NATIVE} : p.weights;
    // Packers run on the model's thread count: the OpenMP default team of this (loading) thread,
    // restored on return.
    struct RestoreThreads {
      int n;
      ~RestoreThreads() { omp_set_num_threads(n); }
    } restore{omp_get_max_threads()};
    omp_set_num_threads(g_.n_threads);
    Loader ld{t};
    const TensorView& embed = ld.row(KVR_T_EMBED, 0);
    const LayerPlan& lp = g_.layer_plan;
    if (lp.tied_embeddings) {
      // Tied: the packed lm_head is the only copy; lookups gather rows from its panels
      // (weights.h embed_row). Qwen3-0.6B: 297 MiB bf16 held once instead of twice. With q8/q4
      // weights the lookups read the quantized rows (as llama.cpp's quantized token_embd): no
      // bf16 table is left beside the quantized lm_head.
      w_.lm_head = Loader::packed({&embed}, g_.hidden, keep_bf16, quant);
    } else if (keep_bf16 && Loader::all_bf16({&embed})) {
      w_.embed_bf16.resize(g_.vocab * g_.hidden);
      Loader::read_bf16(embed, w_.embed_bf16.data());
    } else {
      w_.embed = Loader::vec(&embed);
    }
    w_.final_norm = Loader::vec(t.find(KVR_T_FINAL_NORM));
    if (!lp.tied_embeddings) w_.lm_head = Loader::packed({t.find(KVR_T_LM_HEAD)}, g_.hidden, keep_bf16, quant);
    w_.layer.resize(g_.layers);
    for (size_t l = 0; l < g_.layers; ++l) {
      LayerWeights& L = w_.layer[l];
      L.attn_norm = Loader::vec(t.find(KVR_T_ATTN_NORM, l));
      L.mlp_norm = Loader::vec(t.find(KVR_T_MLP_NORM, l));
      if (lp.qk_norm) {
        L.q_norm = Loader::vec(t.find(KVR_T_Q_NORM, l));
        L.k_norm = Loader::vec(t.find(KVR_T_K_NORM, l));
      }
      const size_t qkv_rows = g_.q_dim + 2 * g_.kv_dim;
      L.qkv = Loader::packed({t.find(KVR_T_Q, l), t.find(KVR_T_K, l), t.find(KVR_T_V, l)}, g_.hidden, keep_bf16, quant);
      if (lp.qkv_bias) {
        L.qkv_bias.resize(qkv_rows);
        Loader::read(ld.row(KVR_T_Q_BIAS, l), L.qkv_bias.data());
        Loader::read(ld.row(KVR_T_K_BIAS, l), L.qkv_bias.data() + g_.q_dim);
        Loader::read(ld.row(KVR_T_V_BIAS, l), L.qkv_bias.data() + g_.q_dim + g_.kv_dim);
      }
      if (lp.o_bias) L.o_bias = Loader::vec(t.find(KVR_T_O_BIAS, l));
      L.o = Loader::packed({t.find(KVR_T_O, l)}, g_.q_dim, keep_bf16, quant);
      L.gate_up = Loader::packed({t.find(KVR_T_GATE, l), t.find(KVR_T_UP, l)}, g_.hidden, keep_bf16, quant);
      if (lp.mlp_bias) {
        L.gate_up_bias.resize(2 * g_.inter);
        Loader::read(ld.row(KVR_T_GATE_BIAS, l), L.gate_up_bias.data());
        Loader::read(ld.row(KVR_T_UP_BIAS, l), L.gate_up_bias.data() + g_.inter);
        L.down_bias = Loader::vec(t.find(KVR_T_DOWN_BIAS, l));
      }
      L.down = Loader::packed({t.find(KVR_T_DOWN, l)}, g_.inter, keep_bf16, quant);
    }
  }

  ModelGeometry g_;
  KernelCap cap_;  // params.cpu_kernel (validated by the loader)
  Weights w_;
  // Freed contiguous caches, kept zeroed for the next sequences (kv_recycle.h: why). Budget per
  // model: 64 MiB and 8 buffers — a demo model's 1024-token cache is 2–8 MiB (f32); a cache over
  // 64 MiB (Qwen3-0.6B from ~290 f32 tokens) is freed as before: its first-touch faults are small
  // next to the prefill or import that fills it. Shared with the caches, which may outlive us.
  std::shared_ptr<KvRecycler> recycler_ = std::make_shared<KvRecycler>(size_t{64} << 20, 8);
};

}  // namespace

}  // namespace kvr::cpu

namespace kvr {

std::unique_ptr<Backend> make_cpu_backend(const ModelGeometry& g, const TensorTable& t) {
  return std::make_unique<cpu::CpuBackend>(g, t);
}

}  // namespace kvr
