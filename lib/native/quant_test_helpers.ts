// Test-only helpers of the q8/q4 oracle tests (quant_gemv_test.ts, quant_gemm_test.ts):
// deterministic weight/activation values and the activation quantizer's rule written out in
// TypeScript. Not imported by production code.

/** Deterministic values: uniform in [-1, 1) per row scale, with an outlier every 97 elements. */
export function quantValues(count: number, seed: number): Float32Array {
  let s = seed >>> 0;
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    const u = s / 2 ** 32 * 2 - 1;
    out[i] = (i % 97 === 13 ? 6 : 1) * u * (0.02 + (i % 7) * 0.01);
  }
  return out;
}

/** Round half to even (the C side's nearbyint under the default rounding mode). */
export function roundEven(v: number): number {
  const r = Math.round(v);
  return Math.abs(v % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** The activation quantizer's rule (gemm_q8.h): per 32-block d = absmax/127, q = rint(x/d). */
export function quantizeActivation(x: Float32Array): { q: Int32Array; d: Float64Array } {
  const blocks = Math.ceil(x.length / 32);
  const q = new Int32Array(x.length), d = new Float64Array(blocks);
  for (let b = 0; b < blocks; b++) {
    let amax = 0;
    for (let i = b * 32; i < Math.min(x.length, b * 32 + 32); i++) {
      amax = Math.max(amax, Math.abs(x[i]));
    }
    const db = Math.fround(amax / 127), inv = db > 0 ? Math.fround(1 / db) : 0;
    d[b] = db;
    for (let i = b * 32; i < Math.min(x.length, b * 32 + 32); i++) {
      q[i] = Math.max(-127, Math.min(127, roundEven(Math.fround(x[i] * inv))));
    }
  }
  return { q, d };
}
