// Tests for the native decode step (a one-row step of native/src/cpu/batch_forward.cpp): one
// parallel region per token whose result must not depend on the thread count or on which count the
// per-sequence tuner picks, and which must agree with the batched prefill path. Needs the built
// library.

import assert from "node:assert/strict";
import { NativeModel } from "./model.ts";
import { assertClose, checkpoint, DEMO_DIRS, tokens } from "./test_helpers.ts";

const STEPS = 24; // > the tuner's 16 probe steps, so both of its thread counts run

// A context of 4 attention blocks (cpu/decode_attention.h kDecodeBlock = 64), the last one
// partial: a split path spreads the blocks over threads.
const CONTEXT = 200;

async function decodeRun(dir: string, threads: number, kvDtype: "f32" | "f16" | "bf16") {
  using m = await NativeModel.load(await checkpoint(dir), { threads, kvDtype });
  const toks = tokens(CONTEXT + STEPS, m.config.vocabSize, 11);
  using s = m.createSequence(CONTEXT + STEPS);
  await s.prefill(toks.slice(0, CONTEXT));
  const out: Float32Array[] = [];
  for (let i = 0; i < STEPS; i++) out.push(await s.decode(toks[CONTEXT + i]));
  return out;
}

for (const kvDtype of ["f32", "f16", "bf16"] as const) {
  // 3 threads: GQA groups that do not divide evenly, so one group's query heads are split.
  Deno.test(`decode() logits are bit-identical at 1, 2 and 3 threads, each demo model (${kvDtype} cache)`, async () => {
    for (const dir of DEMO_DIRS) {
      const one = await decodeRun(dir, 1, kvDtype);
      for (const threads of [2, 3]) {
        const many = await decodeRun(dir, threads, kvDtype);
        for (let i = 0; i < STEPS; i++) {
          const a = one[i], b = many[i];
          let same = a.length === b.length;
          for (let j = 0; same && j < a.length; j++) same = Object.is(a[j], b[j]);
          assert.ok(same, `${dir} step ${i}: 1- and ${threads}-thread logits differ`);
        }
      }
    }
  });
}

Deno.test("decode() matches allPositions prefill rows over many steps (long context), each demo model, f32, f16 and bf16 cache", async () => {
  // A context past several 64-key attention tiles, so the prefill path (flash-style tiles with
  // online softmax) and the decode path (cpu/decode_attention: all scores, one softmax) differ in
  // algorithm: they agree within rounding. Both read the same cache, so bf16 keeps the tolerance.
  for (const dir of DEMO_DIRS) {
    for (const kvDtype of ["f32", "f16", "bf16"] as const) {
      using m = await NativeModel.load(await checkpoint(dir), { threads: 2, kvDtype });
      const toks = tokens(300, m.config.vocabSize, 5);
      using s = m.createSequence(300);
      await s.prefill(toks.slice(0, 280));
      using ref = m.createSequence(300);
      const all = await ref.prefill(toks, { allPositions: true });
      const V = m.config.vocabSize;
      for (let i = 280; i < 300; i++) {
        const inc = await s.decode(toks[i]); // the logits of position i
        assertClose(inc, all.subarray(i * V, (i + 1) * V), 1e-4, `${dir} ${kvDtype} position ${i}`);
      }
    }
  }
});

Deno.test("decode() on several sequences at once (one holds the worker pool, the others run alone) equals one at a time", async () => {
  using m = await NativeModel.load(await checkpoint(DEMO_DIRS[2]), { threads: 2 });
  const V = m.config.vocabSize;
  const streams = [1, 2, 3].map((seed) => tokens(40 + STEPS, V, seed));
  const serial: Float32Array[][] = [];
  for (const toks of streams) {
    using s = m.createSequence(40 + STEPS);
    await s.prefill(toks.slice(0, 40));
    const out = [];
    for (let i = 0; i < STEPS; i++) out.push(await s.decode(toks[40 + i]));
    serial.push(out);
  }
  const seqs = streams.map(() => m.createSequence(40 + STEPS));
  try {
    await Promise.all(seqs.map((s, k) => s.prefill(streams[k].slice(0, 40))));
    for (let i = 0; i < STEPS; i++) {
      const got = await Promise.all(seqs.map((s, k) => s.decode(streams[k][40 + i])));
      got.forEach((g, k) => {
        const want = serial[k][i];
        assert.ok(g.every((x, j) => Object.is(x, want[j])), `sequence ${k} step ${i} differs`);
      });
    }
  } finally {
    for (const s of seqs) s.free();
  }
});
