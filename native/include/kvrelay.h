/*
 * kvrelay.h — the only public C header of libkvrelay: model load from a tensor table, sequences
 * with a KV cache (prefill, decode, truncate, KV read/write), and a GEMM entry point for
 * benchmarks. JSON never crosses this boundary: TypeScript parses config.json and safetensors
 * headers and passes fixed-layout structs (offsets documented per field, little-endian).
 *
 * Rules (DESIGN.md §3): opaque handles, *_free(NULL) is a no-op, every fallible call returns an
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
#define KVR_ABI_VERSION 1

typedef enum kvr_status {
  KVR_OK = 0,
  KVR_ERR_INVALID_ARGUMENT = -1, /* null pointer, bad enum, inconsistent sizes */
  KVR_ERR_OUT_OF_RANGE = -2,     /* index/offset/length outside its bound (token id >= vocab…) */
  KVR_ERR_CAPACITY = -3,         /* sequence KV capacity would be exceeded */
  KVR_ERR_IO = -4,               /* open/mmap/stat failed */
  KVR_ERR_UNSUPPORTED = -5,      /* architecture, dtype or feature not implemented */
  KVR_ERR_OUT_OF_MEMORY = -6,
  KVR_ERR_CORRUPT = -7,          /* file contents inconsistent with the tensor table */
  KVR_ERR_INTERNAL = -8
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

typedef enum kvr_rope_scaling {
  KVR_ROPE_NONE = 0,
  KVR_ROPE_LINEAR = 1, /* positions divided by factor */
  KVR_ROPE_LLAMA3 = 2  /* frequency-dependent scaling (factor, low/high freq factor, orig ctx) */
} kvr_rope_scaling;

/*
 * Model geometry and options. 80 bytes, all fields 4-byte, in this order:
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
 *   off 76 n_threads (u32, 0 = all available cores)
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
} kvr_model_params;

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
 * kv_dtype F32 (exact; BF16 halves cache memory), n_threads 0 (all available cores). */
KVR_API void kvr_model_default_params(kvr_model_params* params);

/*
 * Loads weights. paths: file paths, each NUL-terminated, back to back in one buffer of
 * paths_len bytes; n_paths of them. The files are mmapped read-only and converted to f32 compute
 * layout at load; the mapping is released before return.
 */
KVR_API int32_t kvr_model_load(const kvr_model_params* params, const char* paths, size_t paths_len,
                               uint32_t n_paths, const kvr_tensor_desc* tensors,
                               size_t n_tensors, kvr_model** out_model);
KVR_API void kvr_model_free(kvr_model* model);
/* Worker threads this model's kernels use (resolved from params.n_threads). */
KVR_API uint32_t kvr_model_threads(const kvr_model* model);

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

/*
 * C (m, n) = A (m, k) · B(n, k)ᵀ, f32 row-major, with the same packed kernel the model uses
 * (B is packed on every call; the timed region in benchmarks should use kvr_gemm_packed_*).
 */
KVR_API int32_t kvr_gemm_f32(uint32_t m, uint32_t n, uint32_t k, const float* a, size_t a_len,
                             const float* b, size_t b_len, float* c, size_t c_len,
                             uint32_t n_threads);
/*
 * Times `iterations` runs of the model's GEMM on a pre-packed B (m, n, k), returning the median
 * seconds per run in *out_seconds. Inputs are filled deterministically inside the library.
 */
KVR_API int32_t kvr_gemm_bench(uint32_t m, uint32_t n, uint32_t k, uint32_t n_threads,
                               uint32_t iterations, double* out_seconds);
/* Name of the CPU kernel chosen at runtime ("avx2-fma" or "generic"). */
KVR_API const char* kvr_cpu_kernel_name(void);

/* ---- KV snapshot codec (issue 3: quantize/dequantize chunks) — declarations below ---- */

/* ---- end KV snapshot codec ---- */

#ifdef __cplusplus
}
#endif

#endif /* KVRELAY_H */
