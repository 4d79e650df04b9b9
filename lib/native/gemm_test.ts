// Tests of the native packed GEMM through its TS binding (gemmF32, gemmBench, cpuKernelName):
// results against a plain float64 reference over shapes with row, column and k tails, on the
// runtime-chosen kernel and on each narrower kernel path this CPU has (the cpuKernel argument, in
// this process); the kernel each path names; argument errors. Not a benchmark: bench/ measures
// speed.

import assert from "node:assert/strict";
import { EngineError } from "./mod.ts";
import { cpuKernelName, gemmBench, gemmF32 } from "./gemm.ts";
import type { CpuKernel } from "./layout.ts";
import { openTestLibrary } from "./test_library.ts";
import { cpuFlags } from "./test_helpers.ts";

const FLAGS = cpuFlags();
const HAS_AVX2 = FLAGS.has("avx2") && FLAGS.has("fma");
/** The GEMM kernel each cap must select on this CPU (independent oracle: the flags), for the caps
 *  whose path differs here from auto's or is auto. */
const BEST = HAS_AVX2 && FLAGS.has("avx512f") ? "avx512" : HAS_AVX2 ? "avx2-fma" : "generic";
const CAPS: { cap: CpuKernel; name: string }[] = [
  { cap: "auto", name: BEST },
  { cap: "generic", name: "generic" },
  ...(HAS_AVX2 ? [{ cap: "avx2" as const, name: "avx2-fma" }] : []),
  { cap: "avx512", name: BEST },
];
const F32_EPS = 2 ** -23;

/** Deterministic values in [-1, 1) (mulberry32). */
function randomF32(count: number, seed: number): Float32Array {
  const out = new Float32Array(count);
  let s = seed >>> 0;
  for (let i = 0; i < count; i++) {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    out[i] = (((t ^ (t >>> 14)) >>> 0) / 4294967296) * 2 - 1;
  }
  return out;
}

/**
 * Checks c (m, n) against the float64 reference A (m, k) · B (n, k)ᵀ. The bound per element is
 * the classic f32 summation bound (k + 2)·ε·Σ|a·b|, which any summation order satisfies.
 */
function assertMatchesReference(
  m: number,
  n: number,
  k: number,
  a: Float32Array,
  b: Float32Array,
  c: Float32Array,
  label: string,
): void {
  assert.equal(c.length, m * n, `${label}: c length`);
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let ref = 0;
      let mag = 0;
      for (let t = 0; t < k; t++) {
        const p = a[i * k + t] * b[j * k + t];
        ref += p;
        mag += Math.abs(p);
      }
      const got = c[i * n + j];
      const tol = (k + 2) * F32_EPS * mag + 1e-30;
      if (!(Math.abs(got - ref) <= tol)) {
        assert.fail(`${label}: c[${i},${j}] = ${got}, reference ${ref} (tolerance ${tol})`);
      }
    }
  }
}

// Every test below runs on each kernel path this CPU has (the cap passed to each call): auto, and
// the narrower paths that exist here (generic everywhere, avx2 with AVX2 + FMA; avx512 keeps only
// AMX off, which the plain GEMM never uses, so it is auto's kernel).
for (const { cap, name } of CAPS) {
  Deno.test(`\`gemmF32()\` matches a float64 reference when m, n, k have tails (${cap}: ${name})`, () => {
    let seed = 1;
    for (const m of [1, 2, 5, 7, 64, 100]) {
      for (const n of [1, 15, 16, 17, 33, 250]) {
        for (const k of [1, 3, 64, 257]) {
          const a = randomF32(m * k, seed++);
          const b = randomF32(n * k, seed++);
          const c = gemmF32(m, n, k, a, b, 1, cap);
          assertMatchesReference(m, n, k, a, b, c, `m=${m} n=${n} k=${k}`);
        }
      }
    }
  });

  Deno.test(
    `\`gemmF32()\` matches a float64 reference when split over threads and cache blocks (${cap}: ${name})`,
    () => {
      // Shapes past the single-thread cut-off: k > 256 crosses cache blocks, m > 96 row blocks,
      // m = 1 takes the GEMV path split over weight panels (the cap holds on every thread).
      const shapes: [number, number, number][] = [[200, 250, 700], [97, 33, 257], [1, 1000, 513]];
      let seed = 1000;
      for (const [m, n, k] of shapes) {
        const a = randomF32(m * k, seed++);
        const b = randomF32(n * k, seed++);
        for (const threads of [1, 2, 3, 0]) {
          const c = gemmF32(m, n, k, a, b, threads, cap);
          assertMatchesReference(m, n, k, a, b, c, `m=${m} n=${n} k=${k} threads=${threads}`);
        }
      }
    },
  );

  Deno.test(`\`gemmF32()\` gives bit-identical rows whatever m and the thread count (${cap}: ${name})`, () => {
    // The decode path (m = 1) and every split sum each output in the same order as the batched
    // path, so prefill and decode agree exactly. Shapes cross the k block (300 > 256).
    const [m, n, k] = [37, 250, 300];
    const a = randomF32(m * k, 77);
    const b = randomF32(n * k, 78);
    const full = gemmF32(m, n, k, a, b, 1, cap);
    assertMatchesReference(m, n, k, a, b, full, "bit-identity base");
    assert.deepEqual(gemmF32(m, n, k, a, b, 2, cap), full, "2 threads");
    for (const i of [0, 17, 36]) {
      const row = gemmF32(1, n, k, a.slice(i * k, (i + 1) * k), b, 2, cap);
      assert.deepEqual(row, full.slice(i * n, (i + 1) * n), `row ${i} alone (m = 1)`);
    }
    const firstFive = gemmF32(5, n, k, a.slice(0, 5 * k), b, 2, cap);
    assert.deepEqual(firstFive, full.slice(0, 5 * n), "first 5 rows (m = 5)");
  });
}

Deno.test({
  name:
    "`cpuKernelName()` names the kernel each cap selects: the CPU's best for auto and avx512, " +
    "avx2-fma for avx2 (with AVX2 and FMA), generic for generic",
  ignore: Deno.build.os !== "linux" || Deno.build.arch !== "x86_64",
  fn() {
    for (const { cap, name } of CAPS) assert.equal(cpuKernelName(cap), name, cap);
    assert.equal(cpuKernelName(), BEST, "default");
  },
});

Deno.test("`gemmF32()` and `cpuKernelName()` throw RangeError naming cpuKernel for a bad cap", () => {
  const a = new Float32Array(8), b = new Float32Array(12);
  for (const bad of ["sse", "AVX2", "", 2, null]) {
    assert.throws(
      () => gemmF32(2, 3, 4, a, b, 1, bad as CpuKernel),
      (e: unknown) =>
        e instanceof RangeError && /^cpuKernel must be one of auto, generic/.test(e.message),
    );
    assert.throws(() => cpuKernelName(bad as CpuKernel), /^RangeError: cpuKernel must be one of/);
  }
});

Deno.test("`gemmF32()` throws RangeError before FFI when a or b has the wrong length", () => {
  assert.throws(
    () => gemmF32(2, 3, 4, new Float32Array(7), new Float32Array(12)),
    (e: unknown) => e instanceof RangeError && /a has 7 elements, expected 8/.test(e.message),
  );
  assert.throws(
    () => gemmF32(2, 3, 4, new Float32Array(8), new Float32Array(13)),
    (e: unknown) => e instanceof RangeError && /b has 13 elements, expected 12/.test(e.message),
  );
  assert.throws(() => gemmF32(0, 3, 4, new Float32Array(0), new Float32Array(12)), RangeError);
});

Deno.test("kvr_gemm_f32 reports EngineError OUT_OF_RANGE when a buffer is shorter than needed, INVALID_ARGUMENT for cpu_kernel 5", () => {
  // Straight to the symbol (the TS wrapper would refuse first): the native side checks too.
  const lib = openTestLibrary();
  const call = (
    m: number,
    n: number,
    k: number,
    aLen: number,
    bLen: number,
    cLen: number,
    cap = 0,
  ) =>
    lib.check(
      lib.hooks.kvr_gemm_f32(
        m,
        n,
        k,
        new Float32Array(Math.max(aLen, 1)),
        BigInt(aLen),
        new Float32Array(Math.max(bLen, 1)),
        BigInt(bLen),
        new Float32Array(Math.max(cLen, 1)),
        BigInt(cLen),
        1,
        cap,
      ),
      "kvr_gemm_f32",
    );
  const expectError = (fn: () => void, codeName: string, pattern: RegExp) =>
    assert.throws(fn, (e: unknown) => {
      assert.ok(e instanceof EngineError, `expected EngineError, got ${e}`);
      assert.equal(e.codeName, codeName);
      assert.match(e.message, pattern);
      return true;
    });
  expectError(() => call(2, 3, 4, 7, 12, 6), "OUT_OF_RANGE", /a has 7 floats, m\*k = 2\*4 = 8/);
  expectError(() => call(2, 3, 4, 8, 11, 6), "OUT_OF_RANGE", /b has 11 floats, n\*k = 3\*4 = 12/);
  expectError(() => call(2, 3, 4, 8, 12, 5), "OUT_OF_RANGE", /c has 5 floats, m\*n = 2\*3 = 6/);
  expectError(() => call(0, 3, 4, 8, 12, 6), "INVALID_ARGUMENT", /m=0 n=3 k=4/);
  expectError(
    () => call(2, 3, 4, 8, 12, 6, 5),
    "INVALID_ARGUMENT",
    /cpu_kernel 5 is not a kvr_cpu_kernel/,
  );
  // Exact lengths succeed.
  call(2, 3, 4, 8, 12, 6);
});

Deno.test("`gemmBench()` returns a positive median and EngineError when buffers exceed the cap", () => {
  const seconds = gemmBench(64, 48, 32, 1, 3);
  assert.ok(Number.isFinite(seconds) && seconds > 0, `median ${seconds}`);
  assert.throws(
    () => gemmBench(65536, 65536, 65536, 1, 1),
    (e: unknown) => e instanceof EngineError && e.codeName === "OUT_OF_RANGE",
  );
});
