// The GEMM entry points of libkvrelay for tests and benchmarks (C = A·Bᵀ in f32), and the name of
// the runtime-selected CPU kernel. Arguments are checked before FFI. Not used by the model path.

import { checkInt, quoteValue } from "./check.ts";
import { cString, type NativeLibrary, openNativeLibrary } from "./library.ts";

const DIM_MAX = 0x7fffffff;

/**
 * C (m, n) = A (m, k) · B (n, k)ᵀ, f32 row-major, with the model's packed kernel.
 * @param m rows of A and C
 * @param n rows of B, columns of C
 * @param k shared dimension
 * @param a m×k values
 * @param b n×k values
 * @param threads worker threads (0 = all cores)
 * @param lib library (default openNativeLibrary())
 * @returns C, m×n values
 * @throws TypeError/RangeError for bad sizes; EngineError from native
 */
export function gemmF32(
  m: number,
  n: number,
  k: number,
  a: Float32Array,
  b: Float32Array,
  threads = 0,
  lib: NativeLibrary = openNativeLibrary(),
): Float32Array {
  checkInt("m", m, 1, DIM_MAX);
  checkInt("n", n, 1, DIM_MAX);
  checkInt("k", k, 1, DIM_MAX);
  checkInt("threads", threads, 0, 4096);
  for (const [name, arr, want] of [["a", a, m * k], ["b", b, n * k]] as const) {
    if (!(arr instanceof Float32Array)) {
      throw new TypeError(`${name} must be a Float32Array, got ${quoteValue(arr)}`);
    }
    if (arr.length !== want) {
      throw new RangeError(`${name} has ${arr.length} elements, expected ${want}`);
    }
  }
  const c = new Float32Array(m * n);
  lib.check(
    lib.symbols.kvr_gemm_f32(
      m,
      n,
      k,
      a,
      BigInt(a.length),
      b,
      BigInt(b.length),
      c,
      BigInt(c.length),
      threads,
    ),
    "kvr_gemm_f32",
  );
  return c;
}

/**
 * Median seconds per run of the model's GEMM on a pre-packed B (synchronous; blocks the thread).
 * @param m rows
 * @param n columns
 * @param k shared dimension
 * @param threads worker threads (0 = all cores)
 * @param iterations timed runs (>= 1)
 * @param lib library (default openNativeLibrary())
 * @returns median seconds
 * @throws RangeError for bad sizes; EngineError from native
 */
export function gemmBench(
  m: number,
  n: number,
  k: number,
  threads: number,
  iterations: number,
  lib: NativeLibrary = openNativeLibrary(),
): number {
  checkInt("m", m, 1, DIM_MAX);
  checkInt("n", n, 1, DIM_MAX);
  checkInt("k", k, 1, DIM_MAX);
  checkInt("threads", threads, 0, 4096);
  checkInt("iterations", iterations, 1, 1_000_000);
  const out = new Float64Array(1);
  lib.check(lib.symbols.kvr_gemm_bench(m, n, k, threads, iterations, out), "kvr_gemm_bench");
  return out[0];
}

/**
 * The CPU kernel chosen at runtime.
 * @param lib library (default openNativeLibrary())
 * @returns "avx512", "avx2-fma" or "generic"
 */
export function cpuKernelName(lib: NativeLibrary = openNativeLibrary()): string {
  return cString(lib.symbols.kvr_cpu_kernel_name());
}
