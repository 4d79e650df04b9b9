// The batched step's few-row GEMM with bf16 weights (kvr_gemm_few_rows_bf16: PreparedRows, the
// AMX tiles of native/src/host/gemm_amx.cpp where the CPU has AMX and m ≥ 8): exact where the
// arithmetic is exact (power-of-two weights: the three bf16 planes must rebuild every f32 input
// bit), within f32 rounding of a float64 reference elsewhere (tails of m, n, k; accumulate), the
// AMX path chosen exactly when /proc/cpuinfo lists AMX-BF16 + AMX-TILE, and off under the
// "avx512" kernel cap (the exactness and reference checks rerun under it, in this process).

import assert from "node:assert/strict";
import { gemmFewRowsBf16 } from "./gemm.ts";
import type { CpuKernel } from "./layout.ts";
import { mulberry32 } from "../../tests/fixtures/random_checkpoint.ts";
import { cpuFlags } from "./test_helpers.ts";

/** Whether the AMX path is expected for m rows on this machine under the kernel cap. */
function expectAmx(m: number, cap: CpuKernel = "auto"): boolean {
  const f = cpuFlags();
  return cap === "auto" && m >= 8 && f.has("amx_bf16") && f.has("amx_tile") &&
    f.has("avx512f") && f.has("avx512bw") && f.has("avx512_vnni");
}

/** The caps the first two tests run under: auto, and avx512 (AMX off) where the CPU has AVX-512. */
const CAPS: CpuKernel[] = cpuFlags().has("avx512f") ? ["auto", "avx512"] : ["auto"];

function bf16Bits(v: number): number {
  const u = new Uint32Array(new Float32Array([v]).buffer)[0];
  return (u + 0x7fff + ((u >>> 16) & 1)) >>> 16;
}
function bf16Value(bits: number): number {
  return new Float32Array(new Uint32Array([bits << 16]).buffer)[0];
}

/** f32 values with all 24 significant bits in use, over a wide range of magnitudes. */
function fullPrecision(count: number, seed: number): Float32Array {
  const rnd = mulberry32(seed);
  return Float32Array.from(
    { length: count },
    () => (rnd() < 0.5 ? -1 : 1) * (1 + rnd()) * 2 ** Math.floor(rnd() * 40 - 20),
  );
}

// (m, n): one row tile (m ≤ 16, or the odd last tile of 33, 40, 47) over 1–9 panels: groups of 2
// panels (of 4 from k 512: k 520 below) with tails and a partial last panel; two row tiles over
// pairs of panels.
const SHAPES: [number, number][] = [
  [4, 16],
  [8, 16],
  [9, 77],
  [12, 100],
  [16, 45],
  [16, 96],
  [16, 130],
  [17, 16],
  [32, 77],
  [33, 32],
  [40, 61],
  [47, 45],
];

for (const cap of CAPS) {
  Deno.test(`few-row bf16 GEMM is exact for power-of-two weights: the bf16 planes rebuild every input bit (${cap}${cap === "avx512" ? ": AMX off" : ""})`, () => {
    for (const [m, n] of SHAPES) {
      for (const k of [1, 40, 129]) {
        const x = fullPrecision(m * k, m * 1000 + k);
        // Column c reads input j(c) with weight ±2^e(c): y = x[r][j]·2^e exactly.
        const w = new Uint16Array(n * k);
        const pick = (c: number) => (c * 7 + 3) % k;
        const scale = (c: number) => (c % 2 ? -1 : 1) * 2 ** ((c % 5) - 2);
        for (let c = 0; c < n; c++) w[c * k + pick(c)] = bf16Bits(scale(c));
        const { y, amx } = gemmFewRowsBf16(m, n, k, w, x, undefined, cap);
        assert.equal(amx, expectAmx(m, cap), `AMX chosen for m=${m}`);
        for (let r = 0; r < m; r++) {
          for (let c = 0; c < n; c++) {
            const want = Math.fround(x[r * k + pick(c)] * scale(c));
            assert.ok(
              Object.is(y[r * n + c], want),
              `m=${m} n=${n} k=${k} y[${r}][${c}] = ${y[r * n + c]}, want ${want}`,
            );
          }
        }
      }
    }
  });

  Deno.test(`few-row bf16 GEMM matches a float64 reference with tails of m, n, k and when accumulating (${cap})`, () => {
    for (const [m, n] of SHAPES) {
      for (const k of [1, 31, 32, 33, 130, 300, 520]) {
        const rnd = mulberry32(m * 7919 + n * 31 + k);
        const x = Float32Array.from({ length: m * k }, () => rnd() * 2 - 1);
        const w = Uint16Array.from({ length: n * k }, () => bf16Bits((rnd() * 2 - 1) * 0.1));
        const y0 = Float32Array.from({ length: m * n }, () => rnd() * 4 - 2);
        const wv = Float64Array.from(w, bf16Value); // the weights' values, decoded once
        for (const acc of [false, true]) {
          const { y, amx } = gemmFewRowsBf16(m, n, k, w, x, acc ? y0 : undefined, cap);
          assert.equal(amx, expectAmx(m, cap), `AMX chosen for m=${m}`);
          for (let r = 0; r < m; r++) {
            for (let c = 0; c < n; c++) {
              let ref = acc ? y0[r * n + c] : 0, mag = Math.abs(ref);
              for (let j = 0; j < k; j++) {
                const p = x[r * k + j] * wv[c * k + j];
                ref += p;
                mag += Math.abs(p);
              }
              // Three planes: 3k exact products summed in f32 (+ C): a rounding bound per add.
              const tol = (3 * k + 1) * 2 ** -24 * mag + 1e-30;
              const err = Math.abs(y[r * n + c] - ref);
              assert.ok(
                err <= tol,
                `m=${m} n=${n} k=${k} acc=${acc} [${r}][${c}]: err ${err} > ${tol}`,
              );
            }
          }
        }
      }
    }
  });
}

Deno.test("few-row bf16 GEMM gives a row the same bits whatever rows share its call (AMX)", () => {
  // The batched step runs a thread's group of ≤ 16 rows by itself, where one call of all rows
  // would pair row tiles: the kernels must give each row the same summation (batched == alone).
  const ignore = !expectAmx(32);
  for (const n of [45, 77, 96, 130]) {
    for (const k of [33, 300, 520]) {
      const rnd = mulberry32(n * 131 + k);
      const x = Float32Array.from({ length: 32 * k }, () => rnd() * 2 - 1);
      const w = Uint16Array.from({ length: n * k }, () => bf16Bits((rnd() * 2 - 1) * 0.1));
      const y0 = Float32Array.from({ length: 32 * n }, () => rnd() * 4 - 2);
      for (const acc of [false, true]) {
        const whole = gemmFewRowsBf16(32, n, k, w, x, acc ? y0 : undefined).y;
        for (const [r0, m] of [[0, 16], [16, 16], [0, 9], [24, 8], [5, 13]]) {
          const part = gemmFewRowsBf16(
            m,
            n,
            k,
            w,
            x.slice(r0 * k, (r0 + m) * k),
            acc ? y0.slice(r0 * n, (r0 + m) * n) : undefined,
          );
          if (ignore) continue;
          assert.ok(part.amx);
          for (let i = 0; i < m * n; i++) {
            assert.ok(
              Object.is(part.y[i], whole[r0 * n + i]),
              `n=${n} k=${k} acc=${acc} rows ${r0}+${m}: [${Math.floor(i / n)}][${i % n}] ${
                part.y[i]
              } != ${whole[r0 * n + i]}`,
            );
          }
        }
      }
    }
  }
});
