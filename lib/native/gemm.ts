// The GEMM entry points of the test library (libkvrelay_test.so, kvrelay_test.h) for tests and
// benchmarks (C = A·Bᵀ in f32), and the name of the runtime-selected CPU kernel. The test entry
// points take a CpuKernel (default "auto"): the call runs under it as a model loaded with it would,
// so a test compares kernel paths in one process. Arguments are checked before FFI. Not used by
// the model path.

import { CPU_KERNEL_CODE, WEIGHTS_CODE } from "./abi.ts";
import { checkInt, quoteValue } from "./check.ts";
import { checkCpuKernel, type CpuKernel, type WeightFormat } from "./layout.ts";
import { cString } from "./library.ts";
import { openTestLibrary, type TestLibrary } from "./test_library.ts";

const DIM_MAX = 0x7fffffff;

/**
 * C (m, n) = A (m, k) · B (n, k)ᵀ, f32 row-major, with the model's packed kernel.
 * @param m rows of A and C
 * @param n rows of B, columns of C
 * @param k shared dimension
 * @param a m×k values
 * @param b n×k values
 * @param threads worker threads (0 = all cores)
 * @param cpuKernel kernel paths the call may use (default "auto")
 * @param lib test library (default openTestLibrary())
 * @returns C, m×n values
 * @throws TypeError/RangeError for bad sizes or cpuKernel; EngineError from native
 */
export function gemmF32(
  m: number,
  n: number,
  k: number,
  a: Float32Array,
  b: Float32Array,
  threads = 0,
  cpuKernel: CpuKernel = "auto",
  lib: TestLibrary = openTestLibrary(),
): Float32Array {
  checkCpuKernel("cpuKernel", cpuKernel);
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
    lib.hooks.kvr_gemm_f32(
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
      CPU_KERNEL_CODE[cpuKernel],
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
 * @param lib test library (default openTestLibrary())
 * @returns median seconds
 * @throws RangeError for bad sizes; EngineError from native
 */
export function gemmBench(
  m: number,
  n: number,
  k: number,
  threads: number,
  iterations: number,
  lib: TestLibrary = openTestLibrary(),
): number {
  checkInt("m", m, 1, DIM_MAX);
  checkInt("n", n, 1, DIM_MAX);
  checkInt("k", k, 1, DIM_MAX);
  checkInt("threads", threads, 0, 4096);
  checkInt("iterations", iterations, 1, 1_000_000);
  const out = new Float64Array(1);
  lib.check(lib.hooks.kvr_gemm_bench(m, n, k, threads, iterations, out), "kvr_gemm_bench");
  return out[0];
}

/**
 * A weight packed as the model packs it in `format` ("bf16" here means f32 as given): the values
 * its kernels use (dequantized for q8/q4) and, when x is given, x · Wᵀ through the model's
 * one-row GEMV (q8/q4: activation quantized per 32-block, integer dot products). For tests.
 * @param format weight format
 * @param n output features (rows of w)
 * @param k input features
 * @param w n×k values, row-major
 * @param x k values, or undefined for the dequantized weights only
 * @param cpuKernel kernel paths the call may use (default "auto")
 * @param lib test library (default openTestLibrary())
 * @returns the n×k values the kernels use, and y (n values) when x was given
 * @throws TypeError/RangeError for bad arguments; EngineError from native
 */
export function gemvQuantized(
  format: WeightFormat,
  n: number,
  k: number,
  w: Float32Array,
  x?: Float32Array,
  cpuKernel: CpuKernel = "auto",
  lib: TestLibrary = openTestLibrary(),
): { weights: Float32Array; y?: Float32Array } {
  checkCpuKernel("cpuKernel", cpuKernel);
  if (!Object.hasOwn(WEIGHTS_CODE, format)) {
    throw new TypeError(
      `format must be one of ${Object.keys(WEIGHTS_CODE).join(", ")}, got ${quoteValue(format)}`,
    );
  }
  checkInt("n", n, 1, DIM_MAX);
  checkInt("k", k, 1, DIM_MAX);
  if (!(w instanceof Float32Array) || w.length !== n * k) {
    throw new RangeError(`w must be a Float32Array of n*k = ${n * k} values`);
  }
  if (x !== undefined && (!(x instanceof Float32Array) || x.length !== k)) {
    throw new RangeError(`x must be a Float32Array of k = ${k} values`);
  }
  const weights = new Float32Array(n * k);
  const y = x === undefined ? undefined : new Float32Array(n);
  lib.check(
    lib.hooks.kvr_gemv_quantized(
      WEIGHTS_CODE[format],
      n,
      k,
      w,
      BigInt(w.length),
      x ?? null,
      BigInt(x?.length ?? 0),
      weights,
      BigInt(weights.length),
      y ?? null,
      BigInt(y?.length ?? 0),
      CPU_KERNEL_CODE[cpuKernel],
    ),
    "kvr_gemv_quantized",
  );
  return y === undefined ? { weights } : { weights, y };
}

/**
 * y (m, n) = x (m, k) · Wᵀ (or y0 + x · Wᵀ) with W packed in `format` as the model packs it,
 * through the model's GEMM: for q8/q4 and m > 1 the int8 GEMM (each activation row quantized per
 * 32-block, integer dot products). For tests.
 * @param format weight format ("bf16" means f32 as given)
 * @param m rows of x
 * @param n output features (rows of w)
 * @param k input features
 * @param w n×k values, row-major
 * @param x m×k values, row-major
 * @param options threads (default 1; 0 = all cores), y0 (m×n values to accumulate onto),
 *   cpuKernel (kernel paths the call may use; default "auto")
 * @param lib test library (default openTestLibrary())
 * @returns y, m×n values
 * @throws TypeError/RangeError for bad arguments; EngineError from native
 */
export function gemmQuantized(
  format: WeightFormat,
  m: number,
  n: number,
  k: number,
  w: Float32Array,
  x: Float32Array,
  options: { threads?: number; y0?: Float32Array; cpuKernel?: CpuKernel } = {},
  lib: TestLibrary = openTestLibrary(),
): Float32Array {
  const cpuKernel = checkCpuKernel("cpuKernel", options.cpuKernel ?? "auto");
  if (!Object.hasOwn(WEIGHTS_CODE, format)) {
    throw new TypeError(
      `format must be one of ${Object.keys(WEIGHTS_CODE).join(", ")}, got ${quoteValue(format)}`,
    );
  }
  checkInt("m", m, 1, DIM_MAX);
  checkInt("n", n, 1, DIM_MAX);
  checkInt("k", k, 1, DIM_MAX);
  const threads = options.threads ?? 1;
  checkInt("threads", threads, 0, 4096);
  for (const [name, arr, want] of [["w", w, n * k], ["x", x, m * k]] as const) {
    if (!(arr instanceof Float32Array) || arr.length !== want) {
      throw new RangeError(`${name} must be a Float32Array of ${want} values`);
    }
  }
  const y0 = options.y0;
  if (y0 !== undefined && (!(y0 instanceof Float32Array) || y0.length !== m * n)) {
    throw new RangeError(`y0 must be a Float32Array of m*n = ${m * n} values`);
  }
  const y = y0 === undefined ? new Float32Array(m * n) : y0.slice();
  lib.check(
    lib.hooks.kvr_gemm_quantized(
      WEIGHTS_CODE[format],
      m,
      n,
      k,
      w,
      BigInt(w.length),
      x,
      BigInt(x.length),
      y,
      BigInt(y.length),
      y0 === undefined ? 0 : 1,
      threads,
      CPU_KERNEL_CODE[cpuKernel],
    ),
    "kvr_gemm_quantized",
  );
  return y;
}

/**
 * y = x · Wᵀ (or y0 + x · Wᵀ) through the batched step's few-row GEMM with bf16 weights (AMX tiles
 * where the CPU has them and m ≥ 8), on the calling thread. For tests.
 * @param m rows of x
 * @param n output features (rows of w)
 * @param k input features
 * @param w n×k bf16 bit patterns, row-major
 * @param x m×k values, row-major
 * @param y0 m×n values to accumulate onto (optional)
 * @param cpuKernel kernel paths the call may use (default "auto"; AMX only under "auto")
 * @param lib test library (default openTestLibrary())
 * @returns y (m×n values) and whether the AMX tiles ran
 * @throws RangeError for bad arguments; EngineError from native
 */
export function gemmFewRowsBf16(
  m: number,
  n: number,
  k: number,
  w: Uint16Array,
  x: Float32Array,
  y0?: Float32Array,
  cpuKernel: CpuKernel = "auto",
  lib: TestLibrary = openTestLibrary(),
): { y: Float32Array; amx: boolean } {
  checkCpuKernel("cpuKernel", cpuKernel);
  checkInt("m", m, 1, DIM_MAX);
  checkInt("n", n, 1, DIM_MAX);
  checkInt("k", k, 1, DIM_MAX);
  if (!(w instanceof Uint16Array) || w.length !== n * k) {
    throw new RangeError(`w must be a Uint16Array of ${n * k} values`);
  }
  if (!(x instanceof Float32Array) || x.length !== m * k) {
    throw new RangeError(`x must be a Float32Array of ${m * k} values`);
  }
  if (y0 !== undefined && (!(y0 instanceof Float32Array) || y0.length !== m * n)) {
    throw new RangeError(`y0 must be a Float32Array of m*n = ${m * n} values`);
  }
  const y = y0 === undefined ? new Float32Array(m * n) : y0.slice();
  const amx = new Uint32Array(1);
  lib.check(
    lib.hooks.kvr_gemm_few_rows_bf16(
      m,
      n,
      k,
      w,
      BigInt(w.length),
      x,
      BigInt(x.length),
      y,
      BigInt(y.length),
      y0 === undefined ? 0 : 1,
      amx,
      CPU_KERNEL_CODE[cpuKernel],
    ),
    "kvr_gemm_few_rows_bf16",
  );
  return { y, amx: amx[0] === 1 };
}

/**
 * The CPU GEMM kernel a computation under `cpuKernel` runs.
 * @param cpuKernel kernel paths allowed (default "auto": every path the CPU has)
 * @param lib test library (default openTestLibrary())
 * @returns "avx512", "avx2-fma" or "generic"
 * @throws RangeError for a bad cpuKernel
 */
export function cpuKernelName(
  cpuKernel: CpuKernel = "auto",
  lib: TestLibrary = openTestLibrary(),
): string {
  checkCpuKernel("cpuKernel", cpuKernel);
  return cString(lib.hooks.kvr_cpu_kernel_name(CPU_KERNEL_CODE[cpuKernel]));
}
