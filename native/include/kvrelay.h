/*
 * kvrelay.h — the only public C header of libkvrelay: backend probe, model load from a tensor
 * table, sequences with a KV cache (prefill, decode, truncate, KV read/write), the snapshot codec,
 * cross-model KV projection, native sampling. Test and benchmark hooks are not here: they are
 * exported only by the test library (kvrelay_test.h, libkvrelay_test.so). JSON never crosses
 * this boundary: TypeScript parses config.json and safetensors headers and passes fixed-layout
 * structs (offsets documented per field, little-endian).
 *
 * Rules (docs/native.md): opaque handles, *_free(NULL) is a no-op, every fallible call returns an
 * int32_t status (KVR_OK or a negative kvr_status), the caller owns every buffer and passes its
 * length, and the library checks every length. No exception, exit or abort crosses this boundary.
 *
 * Error messages: kvr_last_error() is thread-local. Deno's nonblocking FFI calls run on a worker
 * thread, so calls on a sequence also record their message on the sequence itself
 * (kvr_seq_last_error), readable from any thread after the call settles.
 */
#ifndef KVRELAY_H
#define KVRELAY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define KVR_API __declspec(dllexport)
#else
#define KVR_API __attribute__((visibility("default")))
#endif

/* Bumped on any change of a signature or struct layout; TypeScript refuses a mismatch. */
#define KVR_ABI_VERSION 4

typedef enum kvr_status {
  KVR_OK = 0,
  KVR_ERR_INVALID_ARGUMENT = -1, /* null pointer, bad enum, inconsistent sizes */
  KVR_ERR_OUT_OF_RANGE = -2,     /* index/offset/length outside its bound (token id >= vocab…) */
  KVR_ERR_CAPACITY = -3,         /* sequence KV capacity would be exceeded */
  KVR_ERR_IO = -4,               /* open/mmap/stat failed */
  KVR_ERR_UNSUPPORTED = -5,      /* architecture, dtype or feature not implemented */
  KVR_ERR_OUT_OF_MEMORY = -6,
  KVR_ERR_CORRUPT = -7,          /* file contents inconsistent with the tensor table */
  KVR_ERR_INTERNAL = -8,
  KVR_ERR_CHECKSUM = -9,         /* a stored CRC32C does not match the bytes (snapshot chunk) */
  KVR_ERR_POOL_EXHAUSTED = -10   /* a paged sequence needs KV blocks its pool does not have free */
} kvr_status;

/* Element types, shared by weights, KV cache and KV read/write buffers. */
typedef enum kvr_dtype {
  KVR_DTYPE_F32 = 0,
  KVR_DTYPE_F16 = 1,
  KVR_DTYPE_BF16 = 2
} kvr_dtype;

typedef enum kvr_arch {
  KVR_ARCH_LLAMA = 1, /* LlamaForCausalLM, MistralForCausalLM */
  KVR_ARCH_QWEN2 = 2, /* q/k/v bias */
  KVR_ARCH_QWEN3 = 3  /* per-head q_norm/k_norm (RMSNorm over head_dim) before RoPE */
} kvr_arch;

/* Compute backend of a model (chosen per model at load). "auto" is resolved by the caller. */
typedef enum kvr_backend {
  KVR_BACKEND_CPU = 0, /* always available; the reference */
  KVR_BACKEND_CUDA = 1 /* an NVIDIA GPU; KVR_ERR_UNSUPPORTED in a build without CUDA */
} kvr_backend;

typedef enum kvr_rope_scaling {
  KVR_ROPE_NONE = 0,
  KVR_ROPE_LINEAR = 1, /* positions divided by factor */
  KVR_ROPE_LLAMA3 = 2  /* frequency-dependent scaling (factor, low/high freq factor, orig ctx) */
} kvr_rope_scaling;

/*
 * Model geometry and options. 96 bytes, all fields 4-byte, in this order:
 *   off  0 arch (u32, kvr_arch)          off  4 vocab_size (u32)
 *   off  8 hidden_size (u32)             off 12 intermediate_size (u32)
 *   off 16 num_layers (u32)              off 20 num_heads (u32)
 *   off 24 num_kv_heads (u32)            off 28 head_dim (u32)
 *   off 32 rms_norm_eps (f32)            off 36 rope_theta (f32)
 *   off 40 rope_scaling (u32)            off 44 rope_factor (f32)
 *   off 48 rope_low_freq_factor (f32)    off 52 rope_high_freq_factor (f32)
 *   off 56 rope_original_max_position (u32)
 *   off 60 tie_word_embeddings (u32 0/1) off 64 attention_bias (u32 0/1: q/k/v/o bias tensors)
 *   off 68 mlp_bias (u32 0/1)            off 72 kv_dtype (u32, kvr_dtype)
 *   off 76 n_threads (u32, 0 = all available cores; CPU backend threads)
 *   off 80 backend (u32, kvr_backend)    off 84 device (u32: CUDA device ordinal, < 2^31; 0 for CPU)
 *   off 88 weights (u32, kvr_weight_format: how linear weights are held in memory)
 *   off 92 cpu_kernel (u32, kvr_cpu_kernel: the CPU kernel paths this model may use)
 * attention_bias=1 means every bias tensor the table lists for q/k/v/o is used (Qwen2 lists
 * q/k/v only; Llama with attention_bias lists all four); a listed bias with attention_bias=0 is
 * an error.
 */
typedef struct kvr_model_params {
  uint32_t arch;
  uint32_t vocab_size;
  uint32_t hidden_size;
  uint32_t intermediate_size;
  uint32_t num_layers;
  uint32_t num_heads;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  float rms_norm_eps;
  float rope_theta;
  uint32_t rope_scaling;
  float rope_factor;
  float rope_low_freq_factor;
  float rope_high_freq_factor;
  uint32_t rope_original_max_position;
  uint32_t tie_word_embeddings;
  uint32_t attention_bias;
  uint32_t mlp_bias;
  uint32_t kv_dtype;
  uint32_t n_threads;
  uint32_t backend;
  uint32_t device;
  uint32_t weights;
  uint32_t cpu_kernel;
} kvr_model_params;

/*
 * How far a model's CPU computations may go among the kernel paths the CPU has (every call on the
 * model: prefill, decode, batched steps, their sampling). AUTO takes every path the CPU has; the
 * others narrow it, so one machine checks each path it can run in one process (results are
 * bit-identical across paths where docs/gemm.md says so): GENERIC the portable kernels, AVX2
 * AVX2 + FMA without AVX-512 or AVX-VNNI (an AVX2-only machine), AVXVNNI without AVX-512 (AVX2 +
 * AVX-VNNI, Alder Lake-like), AVX512 without AMX (an AVX-512 machine without AMX, e.g. AMD Zen 4).
 * A path the CPU lacks stays off whatever the value. Values above 4: KVR_ERR_INVALID_ARGUMENT at
 * load; a value other than AUTO on the CUDA backend: KVR_ERR_UNSUPPORTED.
 */
typedef enum kvr_cpu_kernel {
  KVR_CPU_KERNEL_AUTO = 0,
  KVR_CPU_KERNEL_GENERIC = 1,
  KVR_CPU_KERNEL_AVX2 = 2,
  KVR_CPU_KERNEL_AVXVNNI = 3,
  KVR_CPU_KERNEL_AVX512 = 4
} kvr_cpu_kernel;

/*
 * In-memory format of the linear weights (q/k/v/o, gate/up/down, lm_head), made at load from the
 * checkpoint. NATIVE keeps the checkpoint's precision (BF16 stays bf16, F32/F16 become f32). Q8:
 * 8-bit codes with one bf16 scale (absmax/127 rounded up) per 32 input features per output, 1.0625
 * bytes per weight like llama.cpp Q8_0, run with the activation quantized per 32-block and int8
 * dot products (VNNI where present), for one row and for many (docs/int8_gemm.md). Q4: 4-bit
 * codes per 32 input features per output with an f16 scale and an f16 offset (w ≈ d·c + m,
 * llama.cpp Q4_1-like, fitted by least squares), run the same way. A tied embedding is looked up
 * in the quantized lm_head (no second copy); an untied embedding table and the norms stay as they
 * are. F32: BF16 linear weights and embedding widened to f32 at load (twice bf16's memory and
 * bytes per decode; bit-identical results, as the kernels widen bf16 exactly: the oracle of the
 * bf16 path). Q8, Q4 and F32: CPU backend only (CUDA: KVR_ERR_UNSUPPORTED).
 */
typedef enum kvr_weight_format {
  KVR_WEIGHTS_NATIVE = 0,
  KVR_WEIGHTS_Q8 = 1,
  KVR_WEIGHTS_Q4 = 2,
  KVR_WEIGHTS_F32 = 3
} kvr_weight_format;

/* Which weight a tensor-table row is. Per-layer roles carry the layer index. */
typedef enum kvr_tensor_role {
  KVR_T_EMBED = 1,      /* model.embed_tokens.weight (vocab, hidden) */
  KVR_T_FINAL_NORM = 2, /* model.norm.weight (hidden) */
  KVR_T_LM_HEAD = 3,    /* lm_head.weight (vocab, hidden); absent when tied */
  KVR_T_ATTN_NORM = 10, /* input_layernorm.weight (hidden) */
  KVR_T_Q = 11,         /* q_proj.weight (heads*head_dim, hidden) */
  KVR_T_K = 12,         /* k_proj.weight (kv_heads*head_dim, hidden) */
  KVR_T_V = 13,         /* v_proj.weight (kv_heads*head_dim, hidden) */
  KVR_T_O = 14,         /* o_proj.weight (hidden, heads*head_dim) */
  KVR_T_Q_BIAS = 15,    /* (heads*head_dim) */
  KVR_T_K_BIAS = 16,    /* (kv_heads*head_dim) */
  KVR_T_V_BIAS = 17,    /* (kv_heads*head_dim) */
  KVR_T_O_BIAS = 18,    /* (hidden) */
  KVR_T_Q_NORM = 19,    /* q_norm.weight (head_dim), Qwen3 */
  KVR_T_K_NORM = 20,    /* k_norm.weight (head_dim), Qwen3 */
  KVR_T_MLP_NORM = 21,  /* post_attention_layernorm.weight (hidden) */
  KVR_T_GATE = 22,      /* gate_proj.weight (intermediate, hidden) */
  KVR_T_UP = 23,        /* up_proj.weight (intermediate, hidden) */
  KVR_T_DOWN = 24,      /* down_proj.weight (hidden, intermediate) */
  KVR_T_GATE_BIAS = 25, /* (intermediate), mlp_bias */
  KVR_T_UP_BIAS = 26,   /* (intermediate), mlp_bias */
  KVR_T_DOWN_BIAS = 27  /* (hidden), mlp_bias */
} kvr_tensor_role;

/*
 * One tensor-table row. 64 bytes:
 *   off  0 role (u32)   off  4 layer (u32; 0 for non-layer roles)
 *   off  8 file_index (u32, index into the paths list)   off 12 dtype (u32, kvr_dtype)
 *   off 16 ndim (u32, 1 or 2)   off 20 reserved (u32, must be 0)
 *   off 24 shape[0] (u64)   off 32 shape[1] (u64; 1 when ndim = 1)
 *   off 40 offset (u64, absolute byte offset in the file: 8 + header_len + data_offsets[0])
 *   off 48 nbytes (u64)     off 56 reserved2 (u64, must be 0)
 * The library checks each row: shape matches the geometry for its role, nbytes = product(shape)
 * × dtype size, offset + nbytes within the file, each required role present exactly once.
 */
typedef struct kvr_tensor_desc {
  uint32_t role;
  uint32_t layer;
  uint32_t file_index;
  uint32_t dtype;
  uint32_t ndim;
  uint32_t reserved;
  uint64_t shape[2];
  uint64_t offset;
  uint64_t nbytes;
  uint64_t reserved2;
} kvr_tensor_desc;

typedef struct kvr_model kvr_model;
typedef struct kvr_seq kvr_seq;

KVR_API uint32_t kvr_abi_version(void);
/* Message of the last failed call on this thread ("" if none). Valid until the next call. */
KVR_API const char* kvr_last_error(void);
/* Fills params with defaults: zeros, rms_norm_eps 1e-6, rope_theta 10000, rope_factor 1,
 * kv_dtype F32 (exact; BF16 halves cache memory), n_threads 0 (all available cores),
 * backend CPU, device 0, weights NATIVE, cpu_kernel AUTO. */
KVR_API void kvr_model_default_params(kvr_model_params* params);

/*
 * Whether `backend` (kvr_backend) can run models on `device` (CUDA ordinal; must be 0 for CPU).
 * KVR_OK with a one-line description of the device in info, e.g.
 *   "cpu: Intel(R) Xeon(R) ..., 8 cores, avx2-fma-f16c kernels"
 *   "cuda:0 NVIDIA H200, sm_90, 132 SMs, 139.8 GiB, cuBLASLt 13.0"
 * or a kvr_status with the reason in info (KVR_ERR_UNSUPPORTED: "built without CUDA support
 * (nvcc not found at build time)", no device, no driver; KVR_ERR_INVALID_ARGUMENT: bad
 * backend/device). info (info_len bytes, NULL only when info_len = 0) is always NUL-terminated,
 * truncated to info_len - 1 bytes; kvr_last_error holds the same reason on failure.
 */
KVR_API int32_t kvr_backend_probe(uint32_t backend, int32_t device, char* info, size_t info_len);

/*
 * Loads weights. paths: file paths, each NUL-terminated, back to back in one buffer of
 * paths_len bytes; n_paths of them. The files are mmapped read-only and handed to the backend
 * params.backend on params.device, which converts them to its compute layout (CPU: packed
 * panels, BF16 kept bf16) or uploads them; the mapping is released before return. A backend that
 * cannot run (a build without CUDA, no device) fails with its probe's status and reason.
 */
KVR_API int32_t kvr_model_load(const kvr_model_params* params, const char* paths, size_t paths_len,
                               uint32_t n_paths, const kvr_tensor_desc* tensors,
                               size_t n_tensors, kvr_model** out_model);
KVR_API void kvr_model_free(kvr_model* model);
/* Worker threads this model's kernels use (resolved from params.n_threads). */
KVR_API uint32_t kvr_model_threads(const kvr_model* model);
/* Resident bytes of the model's weights in compute layout (packed panels, tables, norms, biases):
 * BF16 checkpoint weights stay bf16 (2 bytes), others are f32. 0 for NULL. */
KVR_API uint64_t kvr_model_weight_bytes(const kvr_model* model);

/* Which backend and device a loaded model runs on: *out_backend (kvr_backend) and *out_device
 * (either may be NULL) and the device's one-line description in info (as kvr_backend_probe;
 * NUL-terminated, truncated to info_len - 1; info may be NULL when info_len = 0). */
KVR_API int32_t kvr_model_backend(const kvr_model* model, uint32_t* out_backend, uint32_t* out_device,
                                  char* info, size_t info_len);

/* Whether the model's device is still usable: KVR_OK (info "") or KVR_ERR_INTERNAL with the reason
 * in info (a CUDA kernel fault leaves the device context unusable; every later call on the model
 * fails and it must be reloaded; readiness probes answer 503). The CPU backend is always OK. info
 * as kvr_model_backend. */
KVR_API int32_t kvr_model_health(const kvr_model* model, char* info, size_t info_len);

/* A sequence owns a KV cache of `capacity` tokens for every layer. */
KVR_API int32_t kvr_seq_create(kvr_model* model, uint32_t capacity, kvr_seq** out_seq);
KVR_API void kvr_seq_free(kvr_seq* seq);
KVR_API uint32_t kvr_seq_length(const kvr_seq* seq);
KVR_API uint32_t kvr_seq_capacity(const kvr_seq* seq);
/* Message of the last failed call on this sequence ("" if none); any thread may read it. */
KVR_API const char* kvr_seq_last_error(const kvr_seq* seq);

/*
 * Appends n_tokens (>= 1) tokens at positions length..length+n-1 and computes logits.
 * all_positions = 0: logits_out holds the last position's logits, logits_len >= vocab_size.
 * all_positions = 1: (n_tokens, vocab_size) row-major, logits_len >= n_tokens*vocab_size.
 * Fails without changing the sequence on a token id >= vocab, capacity overflow or short buffer.
 * Safe to call concurrently on different sequences of one model.
 */
KVR_API int32_t kvr_seq_prefill(kvr_seq* seq, const int32_t* tokens, size_t n_tokens,
                                uint32_t all_positions, float* logits_out, size_t logits_len);
/* prefill of one token, last-position logits. */
KVR_API int32_t kvr_seq_decode(kvr_seq* seq, int32_t token, float* logits_out, size_t logits_len);
/* Rewinds the cache to n_tokens (<= length). */
KVR_API int32_t kvr_seq_truncate(kvr_seq* seq, uint32_t n_tokens);

/*
 * KV access for one layer and token range [start, start+count). Buffers are
 * (kv_heads, count, head_dim) row-major in `dtype`; keys post-RoPE at their positions.
 * k_bytes/v_bytes must equal kv_heads*count*head_dim*sizeof(dtype). When dtype equals the
 * cache's kv_dtype the copy is bit-exact; otherwise values are converted (round-to-nearest-even).
 * read: start+count <= length. write: start <= length and start+count <= capacity; writing does
 * not change length — call kvr_seq_set_length once every layer of the range is written.
 */
KVR_API int32_t kvr_seq_kv_read(const kvr_seq* seq, uint32_t layer, uint32_t start,
                                uint32_t count, uint32_t dtype, void* k_out, size_t k_bytes,
                                void* v_out, size_t v_bytes);
KVR_API int32_t kvr_seq_kv_write(kvr_seq* seq, uint32_t layer, uint32_t start, uint32_t count,
                                 uint32_t dtype, const void* k_in, size_t k_bytes,
                                 const void* v_in, size_t v_bytes);
/* Sets length to n_tokens (<= capacity). The caller vouches positions < n_tokens hold data. */
KVR_API int32_t kvr_seq_set_length(kvr_seq* seq, uint32_t n_tokens);

/* ---- Paged KV pool and batched step (continuous batching) — declarations below ----
 *
 * A pool is one model's arena of fixed-size KV blocks (block_tokens positions each, every layer's
 * K and V: 2 · layers · kv_heads · block_tokens · head_dim · sizeof(kv_dtype) bytes per block).
 * A paged sequence holds a block table into its pool and takes blocks as it grows (prefill,
 * decode, kv_write, set_length, batch steps) and gives them back on truncate and free (a block
 * shared with another holder stays with it, see "Block sharing" below); its
 * capacity is only a logical bound. Every other kvr_seq_* call works the same on both kinds.
 * A call that would need more blocks than the pool has free fails with KVR_ERR_POOL_EXHAUSTED
 * and changes nothing (no sequence of the pool is touched). The pool handle may be freed before
 * its sequences (they keep the arena alive). Thread-safe: sequences of one pool may run on
 * different threads.
 */
typedef struct kvr_kv_pool kvr_kv_pool;
/* n_blocks >= 1; block_tokens a power of two in [8, 1024]. The arena is calloc'ed at once
 * (pages are committed by the OS as blocks are first written). */
KVR_API int32_t kvr_kv_pool_create(kvr_model* model, uint32_t n_blocks, uint32_t block_tokens,
                                   kvr_kv_pool** out_pool);
KVR_API void kvr_kv_pool_free(kvr_kv_pool* pool);
KVR_API uint32_t kvr_kv_pool_blocks_total(const kvr_kv_pool* pool);
KVR_API uint32_t kvr_kv_pool_blocks_free(const kvr_kv_pool* pool);
KVR_API uint32_t kvr_kv_pool_block_tokens(const kvr_kv_pool* pool);
/* Bytes of one block (see above); 0 for NULL. */
KVR_API uint64_t kvr_kv_pool_block_bytes(const kvr_kv_pool* pool);
/* A sequence of the pool's model holding no block yet; capacity (>= 1) bounds its length. */
KVR_API int32_t kvr_seq_create_paged(kvr_kv_pool* pool, uint32_t capacity, kvr_seq** out_seq);
/* Blocks a paged sequence holds (0 for a contiguous one or NULL). */
KVR_API uint32_t kvr_seq_blocks(const kvr_seq* seq);

/*
 * Block sharing (the prefix cache and forked choices). Every block has a reference count: each
 * paged sequence whose table lists it holds one, and each kvr_kv_pool_ref adds one. A block goes
 * back to the free list only when its count reaches zero, so truncate, set_length, reset and free
 * drop a sequence's references and never free a block another holder has. A write into a block
 * another holder shares (prefill, decode, batch step, kv_write, chunk import, projection) first
 * copies it into a block of the writer's own (copy on write, one block's bytes; the copy counts
 * against the free blocks, so such a write may fail with KVR_ERR_POOL_EXHAUSTED).
 *
 * kvr_seq_block_table: the block ids of a paged sequence, in position order (ids[i] holds
 * positions [i·block_tokens, (i+1)·block_tokens)). *n is set to the count; cap < count is
 * KVR_ERR_CAPACITY (ids untouched), a contiguous sequence KVR_ERR_INVALID_ARGUMENT.
 * kvr_seq_adopt: makes an empty paged sequence (length 0, no block) start from n_blocks blocks
 * of its own pool that already hold the KV of n_tokens positions: its table becomes ids, its
 * length n_tokens, and each block gains a reference (no copy). n_blocks must equal
 * ceil(n_tokens / block_tokens), n_tokens <= capacity, ids distinct and held by some holder
 * (a free block cannot be adopted). The caller vouches the blocks hold those positions' KV (for
 * this model and these tokens). All or none.
 * kvr_kv_pool_ref / kvr_kv_pool_unref: add or drop one reference to each of n ids (a held block:
 * count > 0; unref needs as many references as an id appears). All or none. Ids >= blocks_total
 * are KVR_ERR_OUT_OF_RANGE, the rest KVR_ERR_INVALID_ARGUMENT. The pool's handle must be live.
 * No call may run on these sequences meanwhile; the counts themselves are thread-safe.
 */
KVR_API int32_t kvr_seq_block_table(const kvr_seq* seq, uint32_t* ids, uint32_t cap, uint32_t* n);
KVR_API int32_t kvr_seq_adopt(kvr_seq* seq, const uint32_t* ids, uint32_t n_blocks,
                              uint32_t n_tokens);
KVR_API int32_t kvr_kv_pool_ref(kvr_kv_pool* pool, const uint32_t* ids, uint32_t n);
KVR_API int32_t kvr_kv_pool_unref(kvr_kv_pool* pool, const uint32_t* ids, uint32_t n);

/*
 * One forward step over a batch of sequences of one model: sequence i appends n_tokens[i] (>= 1)
 * tokens — a decode (1) or a prefill chunk (more) — taken in order from `tokens` (tokens_len =
 * Σ n_tokens). Projections run as one GEMM over all Σ n_tokens rows; attention runs per sequence
 * over its own cache. want_logits[i] (0/1): whether sequence i wants the logits of its last new
 * position; those rows are written to logits_out in batch order, (Σ want_logits, vocab) row-major
 * (logits_len >= that). Each sequence's result equals the one-sequence prefill of the same tokens
 * up to float summation order (same greedy tokens; logits within ~1e-5 relative).
 * Checks before any work: n_seqs in [1, 4096], pointers not NULL, sequences distinct and of one
 * model (KVR_ERR_INVALID_ARGUMENT), token ids < vocab (KVR_ERR_OUT_OF_RANGE), each sequence's
 * capacity (KVR_ERR_CAPACITY), Σ n_tokens <= 65536, then the blocks of every paged sequence are
 * taken all or none (KVR_ERR_POOL_EXHAUSTED). On failure no length changes. The message goes to
 * kvr_last_error and to every sequence of the batch. No call may run on these sequences meanwhile.
 */
KVR_API int32_t kvr_batch_step(kvr_seq* const* seqs, uint32_t n_seqs, const uint32_t* n_tokens,
                               const int32_t* tokens, size_t tokens_len,
                               const uint32_t* want_logits, float* logits_out, size_t logits_len);

/*
 * kvr_batch_step where some sequences sample their next token natively instead of returning
 * logits (no vocabulary row crosses the ABI for them): samplers may be NULL (= kvr_batch_step);
 * else samplers[i] non-NULL (distinct samplers, want_logits[i] = 0, 1 <= widths[i] <= vocab)
 * picks from sequence i's last-row logits[0..widths[i]) exactly as kvr_sampler_sample and
 * writes the id to tokens_out[i] (n_seqs entries; others untouched). A row without a finite
 * logit gets -1 and the message on its sampler; the step still succeeds (lengths advance).
 * widths and tokens_out must not be NULL when samplers is not. The samplers are in use for the
 * call (no other call on them meanwhile).
 */
struct kvr_sampler; /* typedef'd with the native sampling functions below */
KVR_API int32_t kvr_batch_step_sample(kvr_seq* const* seqs, uint32_t n_seqs, const uint32_t* n_tokens,
                                      const int32_t* tokens, size_t tokens_len,
                                      const uint32_t* want_logits, float* logits_out,
                                      size_t logits_len, struct kvr_sampler* const* samplers,
                                      const uint32_t* widths, int32_t* tokens_out);

/* ---- end paged KV pool and batched step ---- */

/* ---- KV snapshot codec (quantize/dequantize chunks) — declarations below ---- */

/*
 * Quantization of one KV block (heads, tokens, head_dim) row-major f32 for snapshots
 * (docs/snapshot-format.md). All lengths are element counts; n = heads*tokens*head_dim.
 * axis: KVR_QUANT_PER_CHANNEL = one scale per (head, dim) over the block's tokens (keys);
 *       KVR_QUANT_PER_TOKEN = one scale per (head, token) over head_dim (values).
 * Quantizers reject non-finite input (KVR_ERR_INVALID_ARGUMENT); dequantizers reject scales
 * that are negative or non-finite and mins that are non-finite (KVR_ERR_CORRUPT). A scale that
 * would fall below FLT_MIN is stored as 0 with code 0 (q8: absmax < 127·FLT_MIN ≈ 1.5e-36;
 * q4: max-min < 15·FLT_MIN): such a group decodes to 0 (q8) or its min (q4).
 */
typedef enum kvr_quant_axis {
  KVR_QUANT_PER_CHANNEL = 0,
  KVR_QUANT_PER_TOKEN = 1
} kvr_quant_axis;

/*
 * q8 symmetric: s = absmax/127 per scale group, code = clamp(rint(x/s), -127, 127), s = 0 → 0.
 * codes_len = n; scales_len = heads*head_dim (per channel) or heads*tokens (per token).
 * |x - code*s| <= s/2 (plus f32 rounding).
 */
KVR_API int32_t kvr_kv_quantize_q8(const float* x, size_t x_len, uint32_t heads, uint32_t tokens,
                                   uint32_t head_dim, uint32_t axis, int8_t* codes,
                                   size_t codes_len, float* scales, size_t scales_len);
/* out (n) = code * scale. */
KVR_API int32_t kvr_kv_dequantize_q8(const int8_t* codes, size_t codes_len, const float* scales,
                                     size_t scales_len, uint32_t heads, uint32_t tokens,
                                     uint32_t head_dim, uint32_t axis, float* out,
                                     size_t out_len);
/*
 * q4 asymmetric group-wise: groups of `group` (1..1024) elements along tokens (per channel) or
 * head_dim (per token), the last group of a row possibly shorter. Per group m = min,
 * s = (max-min)/15, code = clamp(rint((x-m)/s), 0, 15). codes: bytes, codes_len = ceil(n/2), flat
 * element 2i in the low nibble (odd tail nibble 0). scales_len = mins_len =
 * heads*ceil(tokens/group)*head_dim (per channel) or heads*tokens*ceil(head_dim/group) (per
 * token). |x - (m + code*s)| <= s/2 (plus f32 rounding).
 */
KVR_API int32_t kvr_kv_quantize_q4(const float* x, size_t x_len, uint32_t heads, uint32_t tokens,
                                   uint32_t head_dim, uint32_t axis, uint32_t group,
                                   uint8_t* codes, size_t codes_len, float* scales,
                                   size_t scales_len, float* mins, size_t mins_len);
/* out (n) = m + code * s. */
KVR_API int32_t kvr_kv_dequantize_q4(const uint8_t* codes, size_t codes_len, const float* scales,
                                     size_t scales_len, const float* mins, size_t mins_len,
                                     uint32_t heads, uint32_t tokens, uint32_t head_dim,
                                     uint32_t axis, uint32_t group, float* out, size_t out_len);

/*
 * CRC32C (Castagnoli, reflected 0x82F63B78) of data (len bytes) continuing from `crc` (0 to
 * start; pass a previous result to extend), into *out. SSE4.2 crc32 instructions when the CPU
 * has them, else a table. data may be NULL only when len = 0.
 */
KVR_API int32_t kvr_crc32c(const uint8_t* data, size_t len, uint32_t crc, uint32_t* out);

/*
 * Snapshot chunk frames straight from / into a sequence's KV cache (docs/snapshot-format.md §1.3,
 * §2; design in docs/gpu-handoff.md): the backend encodes or decodes every layer of the token
 * range itself (CPU: from the host cache; CUDA: on the device), so raw KV never crosses into the
 * caller. The bytes equal what tests/reference/chunk.ts encodeChunk writes from kvr_seq_kv_read.
 * A frame here is the unsigned frame: index (u32), tokens (u32), payload, CRC32C (u32) — an
 * HMAC tag, when signed, is the caller's and is not part of frame/frame_len.
 * encoding: kvr_kv_encoding; group_size: the q4 group (1..1024), must be 0 for every other
 * encoding. tokens >= 1.
 */
typedef enum kvr_kv_encoding {
  KVR_ENC_F32 = 0, /* codes 0..2 coincide with kvr_dtype */
  KVR_ENC_F16 = 1,
  KVR_ENC_BF16 = 2,
  KVR_ENC_Q8 = 3,
  KVR_ENC_Q4 = 4
} kvr_kv_encoding;

/* Bytes of one unsigned chunk frame of `tokens` tokens of this sequence's model, into *out. */
KVR_API int32_t kvr_seq_chunk_bytes(const kvr_seq* seq, uint32_t encoding, uint32_t group_size,
                                    uint32_t tokens, uint64_t* out);
/*
 * Encodes positions [start, start+tokens) (start+tokens <= length) as chunk `index` into frame
 * (frame_len must equal kvr_seq_chunk_bytes). q8/q4 refuse non-finite KV
 * (KVR_ERR_INVALID_ARGUMENT). Lossless encodings read the cache in the encoding's type (exact
 * when it is the cache's type, else rounded to nearest even).
 */
KVR_API int32_t kvr_seq_export_chunk(const kvr_seq* seq, uint32_t encoding, uint32_t group_size,
                                     uint32_t index, uint32_t start, uint32_t tokens,
                                     uint8_t* frame, size_t frame_len);
/*
 * Checks and imports chunk frame `index` holding positions [start, start+tokens): start <=
 * length, start+tokens <= capacity (KVR_ERR_OUT_OF_RANGE / KVR_ERR_CAPACITY), frame_len equal to
 * kvr_seq_chunk_bytes (KVR_ERR_INVALID_ARGUMENT). Then, before writing anything: the CRC32C
 * (KVR_ERR_CHECKSUM "chunk I checksum mismatch: stored crc32c 0x…, computed 0x…"), the stored
 * index and token count (KVR_ERR_CORRUPT), every q8/q4 scale and min (KVR_ERR_CORRUPT), every
 * decoded value finite and still finite once rounded to the cache type (KVR_ERR_CORRUPT "… KV
 * values must be finite"). Then writes every layer (converted to the cache type, nearest even)
 * and sets the length to start+tokens. On failure nothing is written and the length is unchanged.
 */
KVR_API int32_t kvr_seq_import_chunk(kvr_seq* seq, uint32_t encoding, uint32_t group_size,
                                     uint32_t index, uint32_t start, uint32_t tokens,
                                     const uint8_t* frame, size_t frame_len);

/* ---- end KV snapshot codec ---- */

/* ---- Cross-model KV projection (ridge fit accumulation, apply) — declarations below ---- */

/*
 * KV layout used by this section: a "cache block" is (layers, kv_heads, tokens, head_dim)
 * row-major f32 (one model's K or V for a token range; per layer exactly what kvr_seq_kv_read
 * gives in F32), keys post-RoPE. A "feature block" is (tokens, layers*kv_heads*head_dim) f32:
 * per token every layer's heads concatenated in (layer, kv_head, dim) order, keys WITHOUT RoPE
 * (for Qwen3: after k_norm, before the rotation). RoPE parameters come from the model's
 * kvr_model_params (head_dim, rope_theta, rope_scaling and its factors; num_layers and
 * num_kv_heads give the block shape); token i of a block sits at position start_pos + i.
 */

/* Cache block → feature block: removes RoPE from keys (inverse rotate-half at each position),
 * transposes keys and values. k_in/v_in/k_out/v_out lengths are all layers*kv_heads*tokens*
 * head_dim elements. */
KVR_API int32_t kvr_kv_to_features(const kvr_model_params* geometry, uint32_t start_pos,
                                   uint32_t tokens, const float* k_in, size_t k_in_len,
                                   const float* v_in, size_t v_in_len, float* k_out,
                                   size_t k_out_len, float* v_out, size_t v_out_len);
/* Feature block → cache block: applies RoPE to keys at start_pos + i, transposes back. */
KVR_API int32_t kvr_kv_from_features(const kvr_model_params* geometry, uint32_t start_pos,
                                     uint32_t tokens, const float* k_in, size_t k_in_len,
                                     const float* v_in, size_t v_in_len, float* k_out,
                                     size_t k_out_len, float* v_out, size_t v_out_len);

/*
 * Ridge accumulator: streaming float64 sufficient statistics of rows (x, y), x of n_in
 * features, y of n_out outputs: G = Σ [x,1]ᵀ[x,1] ((n_in+1)²), C = Σ [x,1]ᵀ y ((n_in+1, n_out)),
 * Σ y² per output and the row count. Memory is O((n_in+1)·(n_in+1+n_out)) doubles, independent
 * of the rows seen. n_in, n_out in 1..65536 and (n_in+1)·(n_in+1+n_out) <= 2^28.
 */
typedef struct kvr_ridge kvr_ridge;
KVR_API int32_t kvr_ridge_create(uint32_t n_in, uint32_t n_out, kvr_ridge** out_ridge);
KVR_API void kvr_ridge_free(kvr_ridge* ridge);
/* Message of the last failed call on this accumulator ("" if none); any thread may read it
 * (kvr_ridge_accumulate may run on a worker thread). */
KVR_API const char* kvr_ridge_last_error(const kvr_ridge* ridge);
/* Adds rows: x (rows, n_in), y (rows, n_out) row-major f32; rejects non-finite values. */
KVR_API int32_t kvr_ridge_accumulate(kvr_ridge* ridge, const float* x, size_t x_len,
                                     const float* y, size_t y_len, uint32_t rows,
                                     uint32_t n_threads);
/*
 * Adds the fit rows of positions [0, n_tokens) of two sequences of the same token ids: src of the
 * source model, dst of the target. Keys into k_ridge: x = src's key features, y = dst's (RoPE
 * stripped, as kvr_kv_to_features gives them); values into v_ridge the same way. n_in = source
 * layers*kv_heads*head_dim, n_out = the target's; 1 <= n_tokens <= both lengths. The statistics
 * are those of kvr_kv_to_features of both caches + kvr_ridge_accumulate (the CPU backend runs
 * exactly that); a CUDA target with both sequences on its device accumulates on the device in
 * float64 (exact f32×f32 products, f64 sums: equal up to summation order). A non-finite feature
 * is KVR_ERR_INVALID_ARGUMENT and neither accumulator changes. Messages: kvr_ridge_last_error(k_ridge).
 */
KVR_API int32_t kvr_ridge_accumulate_seq(kvr_ridge* k_ridge, kvr_ridge* v_ridge, const kvr_seq* src,
                                         const kvr_seq* dst, uint32_t n_tokens, uint32_t n_threads);
/* Rows accumulated so far. */
KVR_API uint64_t kvr_ridge_rows(const kvr_ridge* ridge);
/* Copies the statistics: g ((n_in+1)², last row/col = the bias column), c ((n_in+1), n_out),
 * yy (n_out). */
KVR_API int32_t kvr_ridge_stats(const kvr_ridge* ridge, double* g, size_t g_len, double* c,
                                size_t c_len, double* yy, size_t yy_len);
/*
 * Solves ridge regression with an unpenalised intercept for outputs [out_start, out_start +
 * out_count) on the feature subset features[0..n_sel) (indices < n_in, strictly increasing):
 * with S = covariance of the selected features and B = their cross-covariance with y (both
 * from the centred statistics), W = (S + lambda·mean(diag S)·I)⁻¹ B by Cholesky, in float64;
 * bias = mean(y) − W·mean(x). w_out (out_count, n_sel) row-major, bias_out (out_count).
 * lambda >= 0 is relative to the mean feature variance (scale-free). A matrix that is not
 * positive definite (e.g. lambda = 0 with collinear features) fails with
 * KVR_ERR_INVALID_ARGUMENT naming the pivot; nothing is written then. Needs >= 2 rows.
 */
KVR_API int32_t kvr_ridge_solve(const kvr_ridge* ridge, const uint32_t* features, uint32_t n_sel,
                                uint32_t out_start, uint32_t out_count, double lambda,
                                double* w_out, size_t w_len, double* bias_out, size_t bias_len);
/*
 * Sum of squared errors of ŷ = W·x_sel + bias over the rows accumulated in `ridge` (e.g. a
 * held-out split), per output, from the statistics alone: sse_out (out_count), and the total
 * sum of squares about each output's mean in sst_out (out_count). Same w/bias layout as solve.
 */
KVR_API int32_t kvr_ridge_sse(const kvr_ridge* ridge, const uint32_t* features, uint32_t n_sel,
                              uint32_t out_start, uint32_t out_count, const double* w,
                              size_t w_len, const double* bias, size_t bias_len, double* sse_out,
                              size_t sse_len, double* sst_out, size_t sst_len);

/*
 * A linear KV projector: source cache block → target cache block for the same token range.
 * Keys: de-rotate with the source RoPE, k_tgt = Wk·k_src + bk in feature space, re-rotate with
 * the target RoPE; values: v_tgt = Wv·v_src + bv. wk/wv (n_tgt, n_src) row-major, bk/bv
 * (n_tgt), with n_src = src layers*kv_heads*head_dim and n_tgt the same for the target.
 */
typedef struct kvr_projector kvr_projector;
KVR_API int32_t kvr_projector_create(const kvr_model_params* source,
                                     const kvr_model_params* target, const float* wk,
                                     size_t wk_len, const float* bk, size_t bk_len,
                                     const float* wv, size_t wv_len, const float* bv,
                                     size_t bv_len, kvr_projector** out_projector);
KVR_API void kvr_projector_free(kvr_projector* projector);
/* Copies W_k (keys = 1) or W_v (keys = 0), (n_tgt, n_src) row-major f32, out of the projector's
 * packed layout: the values given to kvr_projector_create, as a device backend uploads them. */
KVR_API int32_t kvr_projector_weights(const kvr_projector* projector, uint32_t keys, float* w_out,
                                      size_t w_len);
/* Message of the last failed kvr_projector_apply on this projector ("" if none), any thread.
 * kvr_projector_apply is safe to call concurrently on one projector (weights are read-only). */
KVR_API const char* kvr_projector_last_error(const kvr_projector* projector);
/* src_k/src_v: source cache blocks (src layers, kv_heads, tokens, head_dim); dst_k/dst_v:
 * target cache blocks, written. Tokens at positions start_pos.. in both models. */
KVR_API int32_t kvr_projector_apply(const kvr_projector* projector, uint32_t start_pos,
                                    uint32_t tokens, const float* src_k, size_t src_k_len,
                                    const float* src_v, size_t src_v_len, float* dst_k,
                                    size_t dst_k_len, float* dst_v, size_t dst_v_len,
                                    uint32_t n_threads);

/*
 * Sequence → sequence projection, entirely in native memory: reads the source sequence's cache for
 * positions [0, n_tokens), de-rotates keys with the source RoPE, maps K and V as
 * kvr_projector_apply does, re-rotates keys with the target RoPE at the same positions, writes the
 * target sequence's cache (rounded from f32 to its kv_dtype, nearest-even) and sets the target's
 * length to n_tokens. Same bits as kvr_seq_kv_read(F32) of every layer → kvr_projector_apply →
 * kvr_seq_kv_write(F32) of every layer → kvr_seq_set_length. Works in chunks of tokens (one
 * OpenMP thread per chunk; scratch O(chunk · (source + target features)) per thread, not
 * O(n_tokens)). n_threads 0 = all available cores.
 * Checks: projector, src, dst not NULL and src != dst (KVR_ERR_INVALID_ARGUMENT); each sequence's
 * model has the layers, kv_heads, head_dim and RoPE frequencies of the projector's source /
 * target params (KVR_ERR_INVALID_ARGUMENT); 1 <= n_tokens <= length(src) (0: INVALID_ARGUMENT,
 * too many: KVR_ERR_OUT_OF_RANGE); dst empty (length 0, else KVR_ERR_INVALID_ARGUMENT);
 * n_tokens <= capacity(dst) (KVR_ERR_CAPACITY). A failure leaves both lengths unchanged (the
 * source is only read; only an out-of-memory during the projection can have written target
 * positions >= its length, which are never read). The message goes to kvr_last_error (this
 * thread), to the target sequence (kvr_seq_last_error) and to the projector
 * (kvr_projector_last_error). Calls with distinct targets may share a source and a projector
 * concurrently; the caller keeps both sequences otherwise idle until the call returns.
 */
KVR_API int32_t kvr_projector_apply_seq(const kvr_projector* projector, const kvr_seq* src,
                                        kvr_seq* dst, uint32_t n_tokens, uint32_t n_threads);

/* ---- end cross-model KV projection ---- */

/* ---- Native sampling (a decode step returns a token, not logits) ---- */

/*
 * Sampling settings, 40 bytes, by pointer (kvr_sampling_default_params fills the defaults):
 *   off  0 temperature (f64, finite >= 0; 0 = greedy argmax, lowest id on ties; default 1)
 *   off  8 top_p (f64, (0, 1]; 1 = off)   off 16 min_p (f64, [0, 1]; 0 = off)
 *   off 24 seed (i64, |seed| < 2^53)       off 32 top_k (u32; 0 = off)
 *   off 36 reserved (u32, must be 0)
 * The draw is tests/reference/sampler.ts exactly: softmax(logits/T) → top_k → top_p → min_p →
 * renormalise, from the xoshiro128** stream of lib/engine/prng.ts seeded with `seed`, in float64
 * with the same summation order (and JavaScript's exp), so the same logits and seed give the same
 * tokens. NaN logits count as -inf; -inf logits are never drawn.
 */
typedef struct kvr_sampling_params {
  double temperature;
  double top_p;
  double min_p;
  int64_t seed;
  uint32_t top_k;
  uint32_t reserved;
} kvr_sampling_params;

/* Most top-n logprobs one sample call returns. */
#define KVR_SAMPLER_MAX_TOP 64

KVR_API void kvr_sampling_default_params(kvr_sampling_params* params);

/* A sampler: the settings plus its PRNG stream (advanced by every non-greedy draw). One sampler
 * per generation; calls on one sampler must not overlap. */
typedef struct kvr_sampler kvr_sampler;
KVR_API int32_t kvr_sampler_create(const kvr_sampling_params* params, kvr_sampler** out_sampler);
KVR_API void kvr_sampler_free(kvr_sampler* sampler);
/* Message of the last failed call on this sampler ("" if none), readable from any thread. */
KVR_API const char* kvr_sampler_last_error(const kvr_sampler* sampler);
/*
 * Sets the sampler's repetition penalty (transformers' and vLLM's repetition_penalty): before
 * every later draw, the logit of each token seen so far is divided by `penalty` when positive and
 * multiplied by it otherwise (float64, rounded to float32), and both the draw and the logprobs
 * use that row. Seen: seen_ids[0..n_seen) (the prompt; ids >= a row's width are ignored there),
 * then every token this sampler draws. penalty finite > 0; 1 = off (the default). Replaces any
 * earlier setting; call it before the first draw. On a CUDA sequence a penalised step copies the
 * row (kvr_seq_decode_sample).
 */
KVR_API int32_t kvr_sampler_set_repetition_penalty(kvr_sampler* sampler, double penalty,
                                                   const int32_t* seen_ids, size_t n_seen);
/*
 * The rest of vLLM's per-request logit processing, each replacing its earlier setting (call them
 * before the first draw). Before every later draw the row becomes, in this order: the stop ids
 * at -inf while fewer than min_tokens tokens were drawn by this sampler (min_tokens), + bias
 * (logit_bias), the repetition penalty above, - (count·frequency + [count > 0]·presence) for each
 * token this sampler drew count times (presence/frequency penalties); each step in float64
 * rounded to float32. Ids >= a row's width are ignored. The draw and the logprobs use that row.
 * On a CUDA sequence a step with any of them in effect copies the row (kvr_seq_decode_sample).
 *   set_logit_bias: ids[0..n) (>= 0) and the finite values added to their logits (n 0 = none).
 *   set_presence_frequency: finite penalties; 0, 0 = off (the default).
 *   set_min_tokens: min_tokens and stop_ids[0..n_stop) (>= 0); 0 or no ids = off.
 */
KVR_API int32_t kvr_sampler_set_logit_bias(kvr_sampler* sampler, const int32_t* ids, const double* bias,
                                           size_t n);
KVR_API int32_t kvr_sampler_set_presence_frequency(kvr_sampler* sampler, double presence,
                                                   double frequency);
KVR_API int32_t kvr_sampler_set_min_tokens(kvr_sampler* sampler, uint32_t min_tokens,
                                           const int32_t* stop_ids, size_t n_stop);
/*
 * Picks one token from logits[0..width) (1 <= width <= logits_len; ids >= width are never
 * drawn) into *token_out. Optional outputs, log-softmax of the raw logits over [0, width)
 * (temperature 1, no filters, float64): *logprob_out (the chosen token; NULL = not computed);
 * the top_len (<= KVR_SAMPLER_MAX_TOP) most likely ids by logit (ties: lower id) into top_ids and
 * their logprobs into top_logprobs, the count written (fewer when fewer logits are finite) into
 * *top_count_out (may be NULL). A row without a finite logit is KVR_ERR_INVALID_ARGUMENT.
 */
KVR_API int32_t kvr_sampler_sample(kvr_sampler* sampler, const float* logits, size_t logits_len,
                                   uint32_t width, int32_t* token_out, double* logprob_out,
                                   int32_t* top_ids, double* top_logprobs, uint32_t top_len,
                                   uint32_t* top_count_out);

/*
 * The sampler's allowed-token mask (structured output: a grammar's next-token bitmask), used by
 * every draw of this sampler until replaced or cleared — kvr_sampler_sample,
 * kvr_seq_decode_sample and each row of kvr_batch_step_sample. words[0..words_len) is a bit
 * array: bit t % 32 of words[t / 32] set = token t may be drawn; ids >= n_tokens never may.
 * words_len must be (n_tokens + 31) / 32, bits past n_tokens must be 0 (KVR_ERR_OUT_OF_RANGE)
 * and at least one bit set (KVR_ERR_INVALID_ARGUMENT: a mask allowing nothing). The words are
 * copied. n_tokens 0 with words NULL and words_len 0 clears the mask. The draw applies it before
 * temperature and the filters: disallowed logits become -inf, so such a token is never drawn (no
 * rejection and redraw) and the allowed ones keep their relative probabilities; logprobs
 * outputs stay those of the raw row. A draw whose row has no allowed token with a finite logit
 * fails as a row without a finite logit does (KVR_ERR_INVALID_ARGUMENT; -1 in a batched step).
 * A draw on a row shorter than n_tokens (logits_len, or the model's vocabulary) is
 * KVR_ERR_OUT_OF_RANGE, checked before any decode. Not while a call using the sampler runs.
 */
KVR_API int32_t kvr_sampler_set_mask(kvr_sampler* sampler, const uint32_t* words, size_t words_len,
                                     uint32_t n_tokens);

/*
 * Draw first, mask only when the grammar rejects the token (structured output without a mask
 * for every token): with keep 1, each later draw of this sampler (kvr_sampler_sample,
 * kvr_seq_decode_sample, a row of kvr_batch_step_sample) keeps a copy of the row it drew from,
 * after ban, bias and penalties, so kvr_sampler_redraw can replace that draw by one under a mask
 * computed afterwards. keep 0 stops keeping (the buffer stays for the next keep). A device
 * sequence copies such a sampler's row to the host (as for a masked one). keep must be 0 or 1
 * (KVR_ERR_INVALID_ARGUMENT).
 */
KVR_API int32_t kvr_sampler_keep_row(kvr_sampler* sampler, uint32_t keep);

/*
 * Replaces this sampler's last draw with a draw from the row it kept, under the sampler's current
 * mask (set it first; ids >= that draw's width are never drawn): the replaced token stops
 * counting (repetition penalty, presence/frequency, min_tokens), then the draw, the recording of
 * its token and the outputs are kvr_sampler_sample's on that row. Once per draw: without a kept
 * row (keep was 0 at the draw, the draw failed, or it was redrawn already) it is
 * KVR_ERR_INVALID_ARGUMENT. A failed redraw (no allowed token with a finite logit: as
 * kvr_sampler_sample) leaves the sampler as before the replaced draw.
 * Why it is exact: a greedy draw whose token the grammar accepts is the masked argmax (the same
 * token, ties included); for a draw without top_k, top_p or min_p, taking the unmasked token t
 * when allowed and else a masked redraw gives t with probability p(t) + (1 - Z) p(t) / Z =
 * p(t) / Z, Z the allowed mass: the masked distribution (from other PRNG draws). With top_k,
 * top_p or min_p the filters of the masked row differ from those of the unmasked one: mask first.
 */
KVR_API int32_t kvr_sampler_redraw(kvr_sampler* sampler, int32_t* token_out, double* logprob_out,
                                   int32_t* top_ids, double* top_logprobs, uint32_t top_len,
                                   uint32_t* top_count_out);

/*
 * A decode step that returns a token instead of logits: kvr_seq_decode(seq, token) into a buffer
 * the library owns, then kvr_sampler_sample(sampler, those logits, vocab, width, ...). Everything
 * is checked before the decode (sampler, 1 <= width <= vocab, output buffers, then as
 * kvr_seq_decode). Only a row without a finite logit fails after it (KVR_ERR_INVALID_ARGUMENT,
 * the token is appended then). Messages go to the sequence (and the sampler for sampling ones).
 * Results equal that two-call sequence on every backend; on a CUDA sequence greedy and top_k
 * (<= 64) steps without logprobs pick on the device and copy back at most 64 candidates, other
 * steps copy the row (docs/gpu-handoff.md §4).
 */
KVR_API int32_t kvr_seq_decode_sample(kvr_seq* seq, int32_t token, kvr_sampler* sampler,
                                      uint32_t width, int32_t* token_out, double* logprob_out,
                                      int32_t* top_ids, double* top_logprobs, uint32_t top_len,
                                      uint32_t* top_count_out);

/* ---- end native sampling ---- */

#ifdef __cplusplus
}
#endif

#endif /* KVRELAY_H */
