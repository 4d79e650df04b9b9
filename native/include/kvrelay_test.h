/*
 * kvrelay_test.h — the test library's extra exports: libkvrelay_test.so is libkvrelay built from
 * the same objects plus these entry points, which tests and `deno task bench` use to reach
 * internals. The production library (libkvrelay.so) exports none of them. Everything of
 * kvrelay.h is in the test library too, with the same rules.
 */
#ifndef KVRELAY_TEST_H
#define KVRELAY_TEST_H

#include "kvrelay.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The entry points below that take cpu_kernel (a kvr_cpu_kernel, kvrelay.h) run under that cap,
 * on every thread they use, as a model loaded with it would: one process checks each kernel path
 * its CPU has (values above 4: KVR_ERR_INVALID_ARGUMENT). The choice belongs to the call, not
 * the process: calls on other threads keep theirs.
 *
 * C (m, n) = A (m, k) · B(n, k)ᵀ, f32 row-major, with the same packed kernel the model uses
 * (B is packed on every call, so this is for tests; kvr_gemm_bench times a pre-packed B).
 */
KVR_API int32_t kvr_gemm_f32(uint32_t m, uint32_t n, uint32_t k, const float* a, size_t a_len,
                             const float* b, size_t b_len, float* c, size_t c_len,
                             uint32_t n_threads, uint32_t cpu_kernel);
/*
 * Packs w (n, k) row-major f32 in the weight format `weights` (kvr_weight_format; NATIVE = f32)
 * as the model does. When w_deq is not NULL, writes the values the kernels use (n, k) there (the
 * dequantized weights); when y is not NULL, y (n) = x (k) · Wᵀ through the model's one-row GEMV
 * (q8/q4: activation quantized per 32-block, integer dots) on the calling thread.
 */
KVR_API int32_t kvr_gemv_quantized(uint32_t weights, uint32_t n, uint32_t k, const float* w,
                                   size_t w_len, const float* x, size_t x_len, float* w_deq,
                                   size_t w_deq_len, float* y, size_t y_len, uint32_t cpu_kernel);
/*
 * y (m, n) = x (m, k) · Wᵀ (accumulate 1: y += x · Wᵀ) with w (n, k) row-major f32 packed in the
 * weight format `weights` as the model does, through the model's GEMM on n_threads threads (0 =
 * all cores): for q8/q4 and m > 1 the int8 GEMM (activation rows quantized per 32-block).
 */
KVR_API int32_t kvr_gemm_quantized(uint32_t weights, uint32_t m, uint32_t n, uint32_t k, const float* w,
                                   size_t w_len, const float* x, size_t x_len, float* y, size_t y_len,
                                   uint32_t accumulate, uint32_t n_threads, uint32_t cpu_kernel);
/*
 * y (m, n) = x (m, k) · Wᵀ (accumulate 1: y += x · Wᵀ) with w (n, k) row-major bf16 bit patterns,
 * through the batched step's few-row GEMM (the prepared input of several panel ranges: AMX tiles
 * where the CPU has them, m >= 8 and cpu_kernel is AUTO, else the AVX/portable tiles) on the
 * calling thread;
 * *out_amx = 1 when the AMX tiles ran (out_amx may be NULL).
 */
KVR_API int32_t kvr_gemm_few_rows_bf16(uint32_t m, uint32_t n, uint32_t k, const uint16_t* w, size_t w_len,
                                       const float* x, size_t x_len, float* y, size_t y_len,
                                       uint32_t accumulate, uint32_t* out_amx, uint32_t cpu_kernel);
/*
 * Times `iterations` runs of the model's GEMM on a pre-packed B (m, n, k), returning the median
 * seconds per run in *out_seconds (every path the CPU has: KVR_CPU_KERNEL_AUTO). Inputs are
 * filled deterministically inside the library.
 */
KVR_API int32_t kvr_gemm_bench(uint32_t m, uint32_t n, uint32_t k, uint32_t n_threads,
                               uint32_t iterations, double* out_seconds);
/*
 * Name of the CPU GEMM kernel a computation under cpu_kernel runs ("avx512", "avx2-fma" or
 * "generic"); NULL (with kvr_last_error) for a value above 4.
 */
KVR_API const char* kvr_cpu_kernel_name(uint32_t cpu_kernel);
/*
 * Debug switches of a model's backend, for the GPU check (scripts/gpu_check): an OR of the flags
 * below, replacing the model's previous switches (0 = none). They apply to the calls made after
 * this one; set them before the model's first sequence (a batched-step graph captured earlier keeps
 * the route it was captured with). The CPU backend has neither path and ignores them. Unknown bits:
 * KVR_ERR_INVALID_ARGUMENT.
 *   KVR_DEBUG_FALLBACK_GEMM  multi-row projections run the library's own mma.sync GEMM even where
 *                            cuBLASLt loaded (the fallback is otherwise untested on such a machine).
 *   KVR_DEBUG_SYNC_LAUNCHES  every kernel launch (and cuBLASLt matmul) outside graph capture is
 *                            followed by a synchronisation of its stream, so an execution fault is
 *                            reported by the launch that caused it ("attention launch: ...") rather
 *                            than by the next synchronisation. Slow: for locating a fault.
 */
#define KVR_DEBUG_FALLBACK_GEMM 1u
#define KVR_DEBUG_SYNC_LAUNCHES 2u
KVR_API int32_t kvr_model_set_debug(kvr_model* model, uint32_t flags);

/*
 * Production entry points on their other code path, for in-process comparisons of the two paths
 * (no process-wide switch: each call names its path). Arguments, checks and results as the
 * production function's.
 *   kvr_test_projector_apply_seq_via_copies: kvr_projector_apply_seq through the backend-neutral
 *     copy path even for two CPU sequences (the production call projects CPU caches in place).
 *   kvr_test_batch_step_sample_serial: kvr_batch_step_sample whose rows to sample come back from
 *     the backend as logits rows and are drawn one after another on the calling thread after the
 *     step (the production step draws them in the CPU step's last stage, or over the worker pool).
 * (The f32 weights of a BF16 checkpoint are a load option: KVR_WEIGHTS_F32.)
 */
KVR_API int32_t kvr_test_projector_apply_seq_via_copies(const kvr_projector* projector, const kvr_seq* src,
                                                        kvr_seq* dst, uint32_t n_tokens, uint32_t n_threads);
KVR_API int32_t kvr_test_batch_step_sample_serial(kvr_seq* const* seqs, uint32_t n_seqs, const uint32_t* n_tokens,
                                                  const int32_t* tokens, size_t tokens_len,
                                                  const uint32_t* want_logits, float* logits_out,
                                                  size_t logits_len, kvr_sampler* const* samplers,
                                                  const uint32_t* widths, int32_t* tokens_out);

#ifdef __cplusplus
}
#endif

#endif /* KVRELAY_TEST_H */
