// Test-only helpers of the q8/q4 oracle tests (quant_gemv_test.ts, quant_gemm_test.ts,
// weights_q8_test.ts, weights_q4_test.ts): deterministic weight/activation values, the activation
// quantizer's rule written out in TypeScript, a bit digest of logits, and the check that every
// quantized-kernel path of this CPU gives the same logits. Not imported by production code.

import assert from "node:assert/strict";
import { NativeModel } from "./model.ts";
import { checkpoint, DEMO_DIRS, namedKernels, quantKernelCaps, tokens } from "./test_helpers.ts";

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

/** FNV-1a over the bytes of every array: equal digests = equal bits. */
export function digest(xs: Float32Array[]): string {
  let h = 0x811c9dc5;
  for (const x of xs) {
    for (const b of new Uint8Array(x.buffer, x.byteOffset, x.byteLength)) {
      h = Math.imul(h ^ b, 0x01000193) >>> 0;
    }
  }
  return h.toString(16);
}

/** Logits of a 20-token allPositions prefill (every product through the int8 GEMM) and 8 steps
 *  after it (the quantized GEMV). */
async function runQuantized(m: NativeModel): Promise<Float32Array[]> {
  using s = m.createSequence(32);
  const out = [await s.prefill(tokens(20, m.config.vocabSize, 11), { allPositions: true })];
  for (const t of tokens(8, m.config.vocabSize, 12)) out.push(await s.decode(t));
  return out;
}

/**
 * Checks that every demo model loaded with `weights` gives bit-identical logits under each kernel
 * cap this CPU can narrow to (quantKernelCaps) and under the default, and that each cap's model
 * names the kernel the CPU's flags call for.
 * @param weights the quantized format
 */
export async function assertQuantKernelsAgree(weights: "q8" | "q4"): Promise<void> {
  const mine: string[] = [];
  for (const dir of DEMO_DIRS) {
    using m = NativeModel.load(await checkpoint(dir), { threads: 2, weights });
    mine.push(digest(await runQuantized(m)));
  }
  for (const { cap, name } of quantKernelCaps()) {
    const digests: string[] = [];
    for (const dir of DEMO_DIRS) {
      using m = NativeModel.load(await checkpoint(dir), { threads: 2, weights, cpuKernel: cap });
      assert.equal(
        namedKernels(m.deviceInfo)[weights],
        name,
        `${dir}: the ${weights} kernel of the ${cap} cap`,
      );
      const r = await runQuantized(m);
      assert.ok(r.every((x) => x.every(Number.isFinite)), dir);
      digests.push(digest(r));
    }
    assert.deepEqual(digests, mine, `${cap} kernel`);
  }
}
