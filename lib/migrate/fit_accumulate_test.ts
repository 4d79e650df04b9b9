// Tests of RidgeAccumulator.accumulateSequences (kvr_ridge_accumulate_seq, the fit's accumulate
// call behind the backend seam) on the demo pair against the path the fit used before: every
// layer read into JavaScript (readCacheBlock), kvToFeatures, accumulate(). On the CPU backend
// both run the same float64 kernel on the same rows, so the statistics must be equal bit for bit.
// Plus its argument checks and "nothing added" on failure.

import assert from "node:assert/strict";
import { loadModel } from "../engine/mod.ts";
import { EngineError } from "../native/mod.ts";
import { featureWidth, kvToFeatures, readCacheBlock, RidgeAccumulator } from "./native.ts";

const root = new URL("../../", import.meta.url).pathname;

async function demoPair() {
  const fast = await loadModel(`${root}models/tiny-fast`, { threads: 2 });
  const balanced = await loadModel(`${root}models/tiny-balanced`, { threads: 2 });
  return { fast, balanced };
}

function windowIds(w: number, n: number): number[] {
  return Array.from({ length: n }, (_, i) => (w * 7919 + i * 104729 + 11) % 4000);
}

Deno.test("RidgeAccumulator.accumulateSequences() gives the same statistics as kvToFeatures + accumulate() on the demo pair", async () => {
  const { fast, balanced } = await demoPair();
  const ns = featureWidth(fast.native.config), nt = featureWidth(balanced.native.config);
  const before = { k: new RidgeAccumulator(ns, nt), v: new RidgeAccumulator(ns, nt) };
  const after = { k: new RidgeAccumulator(ns, nt), v: new RidgeAccumulator(ns, nt) };
  try {
    using s = fast.native.createSequence(96);
    using t = balanced.native.createSequence(96);
    for (const [w, n] of [[0, 96], [1, 64], [2, 1]]) {
      const ids = windowIds(w, n);
      s.truncate(0);
      t.truncate(0);
      await s.prefill(ids);
      await t.prefill(ids);
      // the old fit path: features through JavaScript
      const sb = readCacheBlock(s, 0, n), tb = readCacheBlock(t, 0, n);
      const x = kvToFeatures(fast.native.config, 0, n, sb.k, sb.v);
      const y = kvToFeatures(balanced.native.config, 0, n, tb.k, tb.v);
      await before.k.accumulate(x.k, y.k, n);
      await before.v.accumulate(x.v, y.v, n);
      await RidgeAccumulator.accumulateSequences(after.k, after.v, s, t, n, 2);
    }
    for (const kv of ["k", "v"] as const) {
      const a = before[kv].stats(), b = after[kv].stats();
      assert.equal(b.rows, a.rows);
      assert.equal(b.rows, 96 + 64 + 1);
      let nonzero = 0;
      for (const f of ["g", "c", "yy"] as const) {
        assert.equal(b[f].length, a[f].length);
        for (let i = 0; i < a[f].length; i++) {
          if (!Object.is(a[f][i], b[f][i])) {
            assert.fail(`${kv}.${f}[${i}]: ${b[f][i]} vs ${a[f][i]}`);
          }
          if (a[f][i] !== 0) nonzero++;
        }
      }
      assert.ok(nonzero > 1000, `statistics look empty (${nonzero} nonzero)`);
    }
  } finally {
    for (const r of [before.k, before.v, after.k, after.v]) r.free();
    fast.native.free();
    balanced.native.free();
  }
});

Deno.test("RidgeAccumulator.accumulateSequences() refuses bad arguments with typed errors and adds nothing", async () => {
  const { fast, balanced } = await demoPair();
  const ns = featureWidth(fast.native.config), nt = featureWidth(balanced.native.config);
  const k = new RidgeAccumulator(ns, nt), v = new RidgeAccumulator(ns, nt);
  const wrong = new RidgeAccumulator(nt, ns);
  try {
    using s = fast.native.createSequence(16);
    using t = balanced.native.createSequence(16);
    await s.prefill(windowIds(0, 16));
    await t.prefill(windowIds(0, 8));
    await assert.rejects(
      () => RidgeAccumulator.accumulateSequences(k, v, s, t, 9),
      /count 9 exceeds a length \(source 16, target 8\)/,
    );
    await assert.rejects(
      () => RidgeAccumulator.accumulateSequences(k, k, s, t, 4),
      /k and v are the same accumulator/,
    );
    await assert.rejects(
      () => RidgeAccumulator.accumulateSequences(k, wrong, s, t, 4),
      new RegExp(`v is ${nt}→${ns}, the sequences need ${ns}→${nt}`),
    );
    await assert.rejects(
      () => RidgeAccumulator.accumulateSequences(k, v, s, s, 4),
      /src and dst are the same sequence/,
    );
    await assert.rejects(() => RidgeAccumulator.accumulateSequences(k, v, s, t, 0), RangeError);
    assert.equal(k.rows, 0);
    assert.equal(v.rows, 0);
    // a non-finite value in the target's cache (last layer's V, position 5): refused natively,
    // neither accumulator changes
    const layer = balanced.native.config.numLayers - 1;
    const kv = t.readKv(layer, 0, 8, "f32");
    const bad = new Float32Array(
      kv.v.buffer.slice(kv.v.byteOffset, kv.v.byteOffset + kv.v.byteLength),
    );
    bad[5 * balanced.native.config.headDim] = NaN;
    t.writeKv(layer, 0, 8, kv.k, new Uint8Array(bad.buffer), "f32");
    await assert.rejects(
      () => RidgeAccumulator.accumulateSequences(k, v, s, t, 8, 1),
      (e: unknown) =>
        e instanceof EngineError && e.codeName === "INVALID_ARGUMENT" &&
        /target value feature \[row 5, column \d+\] = nan is not finite/.test(e.message),
    );
    assert.equal(k.rows, 0);
    assert.equal(v.rows, 0);
    assert.ok(k.stats().g.every((x) => x === 0), "keys accumulator unchanged");
    t.writeKv(layer, 0, 8, kv.k, kv.v, "f32");
    await RidgeAccumulator.accumulateSequences(k, v, s, t, 8, 1);
    assert.equal(k.rows, 8);
    assert.equal(v.rows, 8);
  } finally {
    for (const r of [k, v, wrong]) r.free();
    fast.native.free();
    balanced.native.free();
  }
});
