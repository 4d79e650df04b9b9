// Oracle tests of the int8 GEMM that q8/q4 weights use for more than one activation row
// (kvr_gemm_quantized → native/src/host/gemm_int8.cpp): every output against a float64 sum of
// the dequantized weights times the activation quantized here in TypeScript; within a stated
// bound of the unquantized product (what the earlier dequantize-to-f32 path computed); each row
// bit-identical to the one-row GEMV of that row; the same bits at 1 and 2 threads and when
// accumulating. Shapes cover row, column, k and panel-chunk tails. The checks rerun under each
// narrower kernel cap this CPU can run (in this process).

import assert from "node:assert/strict";
import { gemmQuantized, gemvQuantized } from "./gemm.ts";
import type { CpuKernel } from "./layout.ts";
import { capKernels, quantKernelCaps } from "./test_helpers.ts";
import { quantizeActivation, quantValues } from "./quant_test_helpers.ts";

// (m, n, k): tile-row tails (1..7, 13), a column tail, k tails, k = 8300 (q4's per-row sums go in
// pieces of 256 blocks), and 70×400×1000 (two row blocks and several panel chunks per task).
const SHAPES: [number, number, number][] = [
  [2, 16, 32],
  [7, 37, 100],
  [13, 64, 256],
  [20, 5, 7],
  [6, 33, 64],
  [40, 48, 1000],
  [3, 17, 8300],
  [70, 400, 1000],
];

function bits(a: Float32Array): Uint32Array {
  return new Uint32Array(a.buffer, a.byteOffset, a.length);
}

/** The oracle checks on the kernels of `cap`. */
function checkOracle(cap: CpuKernel): void {
  for (const format of ["q8", "q4"] as const) {
    for (const [m, n, k] of SHAPES) {
      const at = `${cap} ${format} ${m}x${n}x${k}`;
      const w = quantValues(n * k, n * 31 + k), x = quantValues(m * k, m * 7 + k);
      const { weights: deq } = gemvQuantized(format, n, k, w, undefined, cap);
      const y = gemmQuantized(format, m, n, k, w, x, { cpuKernel: cap });
      for (let r = 0; r < m; r++) {
        const xr = x.subarray(r * k, (r + 1) * k);
        const { q, d } = quantizeActivation(xr);
        for (let j = 0; j < n; j++) {
          let ref = 0, mag = 0, plain = 0, slack = 0;
          for (let i = 0; i < k; i++) {
            const wv = deq[j * k + i], db = d[Math.floor(i / 32)];
            const t = db * wv * q[i];
            ref += t;
            mag += Math.abs(t);
            plain += wv * xr[i];
            slack += Math.abs(wv) * db / 2;
          }
          const got = y[r * n + j];
          // f32 per-block scale products and accumulation: a few ulps of the magnitude.
          assert.ok(
            Math.abs(got - ref) <= 1e-6 * mag + 1e-30,
            `${at} row ${r} col ${j}: ${got} vs float64 ${ref} (magnitude ${mag})`,
          );
          // Against the unquantized activation (the dequantize-then-f32 product): each code is
          // within half a step d/2 of x/d·d, so the sum moves by at most Σ|w|·d/2.
          assert.ok(
            Math.abs(got - plain) <= slack * (1 + 1e-5) + 1e-6 * mag + 1e-30,
            `${at} row ${r} col ${j}: ${got} vs unquantized ${plain}, bound ${slack}`,
          );
        }
        // The one-row GEMV (decode) of the same row: the same bits.
        const { y: g } = gemvQuantized(format, n, k, w, xr, cap);
        assert.deepEqual(bits(y.subarray(r * n, (r + 1) * n)), bits(g!), `${at} row ${r} vs GEMV`);
      }
    }
  }
}

Deno.test("int8 GEMM equals a float64 sum of dequantized weights × quantized rows", () =>
  checkOracle("auto"));

Deno.test("int8 GEMM gives the same bits at 1 and 2 threads and adds onto y when accumulating", () => {
  for (const format of ["q8", "q4"] as const) {
    for (const [m, n, k] of SHAPES) {
      const at = `${format} ${m}x${n}x${k}`;
      const w = quantValues(n * k, n + k), x = quantValues(m * k, m + 3 * k);
      const one = gemmQuantized(format, m, n, k, w, x, { threads: 1 });
      const two = gemmQuantized(format, m, n, k, w, x, { threads: 2 });
      assert.deepEqual(bits(two), bits(one), `${at}: 2 threads`);
      const y0 = quantValues(m * n, 5);
      const acc = gemmQuantized(format, m, n, k, w, x, { threads: 2, y0 });
      const want = new Float32Array(m * n);
      for (let i = 0; i < m * n; i++) want[i] = y0[i] + one[i]; // one f32 rounding, as y += acc
      assert.deepEqual(bits(acc), bits(want), `${at}: accumulate`);
    }
  }
});

Deno.test("gemmQuantized rejects an unknown format, wrong lengths and an unknown cpuKernel before FFI", () => {
  const w = quantValues(16 * 32, 1), x = quantValues(2 * 32, 2);
  assert.throws(() => gemmQuantized("q3" as "q8", 2, 16, 32, w, x), /format must be one of/);
  assert.throws(() => gemmQuantized("q8", 2, 16, 31, w, x), /w must be a Float32Array of 496/);
  assert.throws(() => gemmQuantized("q8", 3, 16, 32, w, x), /x must be a Float32Array of 96/);
  assert.throws(
    () => gemmQuantized("q4", 2, 16, 32, w, x, { y0: new Float32Array(3) }),
    /y0 must be a Float32Array of m\*n = 32/,
  );
  assert.throws(
    () => gemmQuantized("q8", 2, 16, 32, w, x, { cpuKernel: "fast" as CpuKernel }),
    (e: unknown) =>
      e instanceof RangeError && /^cpuKernel must be one of auto, generic/.test(e.message),
  );
});

Deno.test("int8 GEMM oracle holds on every kernel this CPU can run (rows, avx-vnni)", async () => {
  for (const { cap, name } of quantKernelCaps()) {
    // Without VNNI (generic, avx2) the rows go through the GEMV kernel of that path.
    const int8 = name === "avx-vnni" ? "avx-vnni" : "rows";
    assert.equal((await capKernels(cap)).int8, int8, `the int8 kernel of the ${cap} cap`);
    checkOracle(cap);
  }
});
