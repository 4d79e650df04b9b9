// Oracle tests of the q8/q4 weight formats at the single-product level (kvr_gemv_quantized): the
// dequantized weights against the quantization rules (q8 nearest code; q4 at most 16 levels per
// block and no worse than min/max scaling), and the quantized GEMV against a float64 dot of the
// dequantized weights with the activation quantized here in TypeScript. Shapes include k and n
// tails. The same checks rerun under each narrower kernel cap this CPU can run (in this process).

import assert from "node:assert/strict";
import { gemvQuantized } from "./gemm.ts";
import type { CpuKernel, WeightFormat } from "./layout.ts";
import { capKernels, quantKernelCaps } from "./test_helpers.ts";
import { quantizeActivation as quantizeX, quantValues as values } from "./quant_test_helpers.ts";

const SHAPES: [number, number][] = [[37, 100], [64, 256], [16, 32], [5, 7], [48, 1000]];

/** f32 d ≥ 0 rounded up to the next bfloat16 (the q8 weight scale, gemm.h "q8 layout"). */
function bf16RoundUp(d: number): number {
  const f = new Float32Array([d]), u = new Uint32Array(f.buffer);
  if ((u[0] & 0xffff) !== 0) u[0] += 0x10000;
  u[0] &= 0xffff0000;
  return f[0];
}

/** Checks the dequantized weights of one format against its rule; throws naming the block. */
function checkWeights(
  format: WeightFormat,
  n: number,
  k: number,
  w: Float32Array,
  deq: Float32Array,
) {
  for (let r = 0; r < n; r++) {
    for (let k0 = 0; k0 < k; k0 += 32) {
      const k1 = Math.min(k, k0 + 32);
      const at = `${format} ${n}x${k} row ${r} block ${k0 / 32}`;
      let mn = Infinity, mx = -Infinity, amax = 0, err = 0;
      const levels = new Set<number>();
      for (let i = k0; i < k1; i++) {
        const v = w[r * k + i];
        mn = Math.min(mn, v);
        mx = Math.max(mx, v);
        amax = Math.max(amax, Math.abs(v));
        err += (v - deq[r * k + i]) ** 2;
        levels.add(deq[r * k + i]);
      }
      if (format === "q8") {
        // The stored scale: amax/127 rounded up to bf16; every value d·q with |q| ≤ 127 and
        // within d/2 (the codes are quantized against the stored d).
        const d = bf16RoundUp(Math.fround(amax / 127));
        for (let i = k0; i < k1; i++) {
          const e = Math.abs(w[r * k + i] - deq[r * k + i]);
          assert.ok(e <= d * 0.5 * (1 + 1e-5), `${at}: error ${e} > d/2 = ${d / 2}`);
          const q = d > 0 ? deq[r * k + i] / d : 0;
          assert.ok(
            Number.isInteger(q) && Math.abs(q) <= 127,
            `${at}: ${deq[r * k + i]} is not d·q (d ${d})`,
          );
        }
      } else {
        assert.ok(levels.size <= 16, `${at}: ${levels.size} distinct values`);
        // Plain min/max scaling (d = range/15, m = min) in float64 is the fit's starting point;
        // f16 rounding of d and m may cost a hair, the least-squares refits only gain.
        const d = (mx - mn) / 15;
        let minmax = 0;
        for (let i = k0; i < k1; i++) {
          const c = d > 0 ? Math.round((w[r * k + i] - mn) / d) : 0;
          minmax += (w[r * k + i] - (mn + c * d)) ** 2;
        }
        assert.ok(err <= minmax * 1.02 + 1e-12, `${at}: squared error ${err} > min/max ${minmax}`);
      }
    }
  }
}

/** The oracle checks on the kernels of `cap`. */
function checkOracle(cap: CpuKernel): void {
  for (const format of ["q8", "q4"] as const) {
    for (const [n, k] of SHAPES) {
      const w = values(n * k, n * 31 + k), x = values(k, k * 7 + 1);
      const { weights: deq, y } = gemvQuantized(format, n, k, w, x, cap);
      checkWeights(format, n, k, w, deq);
      const { q, d } = quantizeX(x);
      for (let j = 0; j < n; j++) {
        let ref = 0, mag = 0;
        for (let i = 0; i < k; i++) {
          const t = d[Math.floor(i / 32)] * deq[j * k + i] * q[i];
          ref += t;
          mag += Math.abs(t);
        }
        // f32 per-block scale products and accumulation: a few ulps of the magnitude.
        assert.ok(
          Math.abs(y![j] - ref) <= 1e-6 * mag + 1e-30,
          `${cap} ${format} ${n}x${k} output ${j}: ${y![j]} vs float64 ${ref} (magnitude ${mag})`,
        );
      }
    }
  }
}

Deno.test(
  "quantized GEMV equals a float64 dot of the dequantized weights and quantized activation",
  () => checkOracle("auto"),
);

Deno.test("q8 weights of tiny magnitude keep the nearest-code rule (bf16 scales do not underflow)", () => {
  // amax/127 near 1e-9 is far below f16's normal range (6e-5): an f16 scale would lose its
  // precision or flush to zero there; bf16 has f32's exponent range.
  const [n, k] = [16, 64];
  const w = values(n * k, 5).map((v) => v * 1e-7);
  checkWeights("q8", n, k, w, gemvQuantized("q8", n, k, w).weights);
});

Deno.test("bf16 (f32 given) weights pass through kvr_gemv_quantized unchanged", () => {
  const w = values(5 * 7, 3);
  assert.deepEqual(gemvQuantized("bf16", 5, 7, w).weights, w);
});

Deno.test("gemvQuantized rejects an unknown format, wrong lengths and an unknown cpuKernel before FFI", () => {
  const w = values(16 * 32, 1);
  assert.throws(() => gemvQuantized("q3" as WeightFormat, 16, 32, w), /format must be one of/);
  assert.throws(() => gemvQuantized("q4", 16, 31, w), /w must be a Float32Array of n\*k/);
  assert.throws(() => gemvQuantized("q4", 16, 32, w, new Float32Array(31)), /x must be/);
  assert.throws(
    () => gemvQuantized("q4", 16, 32, w, undefined, "avx3" as CpuKernel),
    (e: unknown) =>
      e instanceof RangeError && /^cpuKernel must be one of auto, generic/.test(e.message),
  );
});

Deno.test("quantized GEMV oracle holds on every kernel this CPU can run (generic, avx2, avx-vnni)", async () => {
  for (const { cap, name } of quantKernelCaps()) {
    assert.equal((await capKernels(cap)).q4, name, `the q4 kernel of the ${cap} cap`);
    checkOracle(cap);
  }
});
