// The Deno FFI symbols of the test library's extra exports (native/include/kvrelay_test.h):
// kernel entry points, benchmarks, debug switches and production entry points on their other
// code path. Opened only by openTestLibrary (test_library.ts); serving code never sees them.

import { batchStepSample } from "./symbols.ts";

/** Test and benchmark hooks of libkvrelay_test.so. */
export const testSymbols = {
  // (m, n, k, a, a_len, b, b_len, c, c_len, n_threads, cpu_kernel)
  kvr_gemm_f32: {
    parameters: [
      "u32",
      "u32",
      "u32",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "u32",
      "u32",
    ],
    result: "i32",
  },
  // (m, n, k, n_threads, iterations, out_seconds f64*)
  kvr_gemm_bench: {
    parameters: ["u32", "u32", "u32", "u32", "u32", "buffer"],
    result: "i32",
  },
  // (weights, n, k, w, w_len, x, x_len, w_deq, w_deq_len, y, y_len, cpu_kernel)
  kvr_gemv_quantized: {
    parameters: [
      "u32",
      "u32",
      "u32",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "u32",
    ],
    result: "i32",
  },
  // (m, n, k, w u16*, w_len, x, x_len, y, y_len, accumulate, out_amx u32*, cpu_kernel)
  kvr_gemm_few_rows_bf16: {
    parameters: [
      "u32",
      "u32",
      "u32",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "u32",
      "buffer",
      "u32",
    ],
    result: "i32",
  },
  // (weights, m, n, k, w, w_len, x, x_len, y, y_len, accumulate, n_threads, cpu_kernel)
  kvr_gemm_quantized: {
    parameters: [
      "u32",
      "u32",
      "u32",
      "u32",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "u32",
      "u32",
      "u32",
    ],
    result: "i32",
  },
  // (cpu_kernel)
  kvr_cpu_kernel_name: { parameters: ["u32"], result: "pointer" },
  // (model, flags: KVR_DEBUG_*)
  kvr_model_set_debug: { parameters: ["pointer", "u32"], result: "i32" },
  // (projector, src, dst, n_tokens, n_threads): kvr_projector_apply_seq on the copy path
  kvr_test_projector_apply_seq_via_copies: {
    parameters: ["pointer", "pointer", "pointer", "u32", "u32"],
    result: "i32",
  },
  // kvr_batch_step_sample's arguments; the rows drawn one after another after the step
  kvr_test_batch_step_sample_serial: batchStepSample,
} as const satisfies Deno.ForeignLibraryInterface;
