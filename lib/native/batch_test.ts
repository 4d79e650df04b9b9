// Tests of NativeModel.batchStep (kvr_batch_step): every sequence of a batch of random
// compositions (decodes and prefill chunks mixed, sequences joining and leaving) gets the logits
// of running it alone, on the demo models and the generated checkpoints; a sample is also checked
// against the float64 reference; native sampling inside the step draws what the same sampler
// draws from the alone logits; and bad batches are refused before any work.

import assert from "node:assert/strict";
import { loadCheckpoint } from "../model/mod.ts";
import {
  type BatchItem,
  type KvDtype,
  NativeModel,
  NativeSampler,
  type NativeSamplingOptions,
  type NativeSequence,
} from "./mod.ts";
import { checkpoint, DEMO_DIRS, relDiff, tokens } from "./test_helpers.ts";
import {
  mulberry32,
  ORACLE_CASES,
  writeRandomCheckpoint,
} from "../../tests/fixtures/random_checkpoint.ts";
import { loadReferenceModel, referenceForward } from "../../tests/reference/forward.ts";
import { syncStep } from "./sync_step.ts";
import { openTestLibrary, type TestLibrary } from "./test_library.ts";

/** Batched vs alone on CPU: the contract's bound (same kernels, different summation splits). */
const REL_TOL = 1e-5;
/** With a bf16 cache a last-bit difference in a layer's output can round a stored K/V entry to
 * the neighbouring bf16 value (2^-8 relative), which later layers see: observed 2.0e-5 on
 * tiny-powerful; 1e-4 keeps a 5× margin and still catches any real mix-up (those
 * are O(1)). */
const REL_TOL_BF16 = 1e-4;

/** A step whose items only ask for logits: each result is a row or null. */
async function logitsStep(
  model: NativeModel,
  items: BatchItem[],
): Promise<(Float32Array | null)[]> {
  const out = await model.batchStep(items);
  return out.map((r) => {
    assert.ok(r === null || r instanceof Float32Array, "no item asked for a sample");
    return r;
  });
}

function argmax(x: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

interface Lane {
  ids: number[];
  seq: NativeSequence | null;
  fed: number;
  /** the step at which it joins */
  joinAt: number;
}

/**
 * Runs `lanes` prompts through random batched steps (each step: a random subset of the joined,
 * unfinished lanes, each with a random chunk of 1..maxChunk tokens; lanes join at random steps
 * and are freed as soon as they finish) and compares every returned logits row with the same
 * position of the lane's own all-positions prefill. Returns the worst relative difference.
 */
async function batchedVsAlone(
  model: NativeModel,
  opts: { lanes: number; maxLen: number; maxChunk: number; seed: number; paged: boolean },
): Promise<{ worst: number; steps: number; rows: number }> {
  const rnd = mulberry32(opts.seed);
  const vocab = model.config.vocabSize;
  const pool = opts.paged ? model.createKvPool(4096, 16) : null;
  const lanes: Lane[] = [];
  for (let i = 0; i < opts.lanes; i++) {
    const n = 1 + Math.floor(rnd() * opts.maxLen);
    lanes.push({
      ids: tokens(n, vocab, opts.seed * 100 + i),
      seq: null,
      fed: 0,
      joinAt: Math.floor(rnd() * 6),
    });
  }
  const alone: Float32Array[] = [];
  for (const l of lanes) {
    using s = model.createSequence(l.ids.length);
    alone.push(await s.prefill(l.ids, { allPositions: true }));
  }
  let worst = 0, steps = 0, rows = 0;
  try {
    for (let step = 0; lanes.some((l) => l.fed < l.ids.length); step++) {
      const items: BatchItem[] = [];
      const which: { lane: number; pos: number; want: boolean }[] = [];
      lanes.forEach((l, i) => {
        if (step < l.joinAt || l.fed >= l.ids.length || rnd() < 0.25) return;
        l.seq ??= pool ? pool.createSequence(l.ids.length) : model.createSequence(l.ids.length);
        const n = Math.min(
          l.ids.length - l.fed,
          rnd() < 0.5 ? 1 : 1 + Math.floor(rnd() * opts.maxChunk),
        );
        const want = rnd() < 0.8 || l.fed + n === l.ids.length;
        items.push({ seq: l.seq, tokens: l.ids.slice(l.fed, l.fed + n), wantLogits: want });
        which.push({ lane: i, pos: l.fed + n - 1, want });
        l.fed += n;
      });
      if (items.length === 0) continue;
      const out = await logitsStep(model, items);
      steps++;
      out.forEach((logits, k) => {
        const { lane, pos, want } = which[k];
        assert.equal(logits !== null, want, "logits exactly for the rows that want them");
        if (!logits) return;
        rows++;
        const ref = alone[lane].subarray(pos * vocab, (pos + 1) * vocab);
        worst = Math.max(worst, relDiff(logits, ref));
        assert.equal(argmax(logits), argmax(ref), `greedy token of lane ${lane} at ${pos}`);
      });
      for (const l of lanes) {
        if (l.seq && l.fed === l.ids.length) {
          assert.equal(l.seq.length, l.ids.length);
          l.seq.free(); // leaves the batch
          l.seq = null;
        }
      }
    }
    if (pool) assert.equal(pool.blocksFree, pool.blocksTotal, "every block back in the pool");
  } finally {
    for (const l of lanes) l.seq?.free();
    pool?.free();
  }
  return { worst, steps, rows };
}

Deno.test("batchStep() gives every sequence its alone logits when each thread runs whole sequences (40 lanes, short chunks)", async () => {
  // Steps of 30–60 rows of many sequences: cpu/batch_forward.cpp splits them into one group of
  // whole sequences per thread (no stage between the threads).
  for (const dir of [DEMO_DIRS[0], DEMO_DIRS[2]]) {
    using model = NativeModel.load(await checkpoint(dir), { threads: 2 });
    const r = await batchedVsAlone(model, {
      lanes: 40,
      maxLen: 60,
      maxChunk: 3,
      seed: 11,
      paged: true,
    });
    assert.ok(r.rows > 400, `compared ${r.rows} rows`);
    assert.ok(r.worst <= REL_TOL, `${dir}: worst relative difference ${r.worst.toExponential(3)}`);
  }
});

for (const dir of DEMO_DIRS) {
  const name = dir.split("/").pop();
  for (const kvDtype of ["f32", "bf16"] as KvDtype[]) {
    Deno.test(`batchStep() gives every sequence its alone logits on ${name} (${kvDtype} KV, paged, random mixes)`, async () => {
      using model = NativeModel.load(await checkpoint(dir), { threads: 2, kvDtype });
      const r = await batchedVsAlone(model, {
        lanes: 12,
        maxLen: 90,
        maxChunk: 24,
        seed: 7,
        paged: true,
      });
      assert.ok(r.rows > 40, `compared ${r.rows} rows`);
      const tol = kvDtype === "f32" ? REL_TOL : REL_TOL_BF16;
      assert.ok(r.worst <= tol, `${name}: worst relative difference ${r.worst.toExponential(3)}`);
    });
  }
}

/**
 * Random mixed steps as in batchedVsAlone, then every lane replayed alone: a fresh sequence fed
 * the same chunks in one-item steps. Returns the worst relative difference of the rows both
 * runs returned. The oracle for quantized weights: int8 activation rounding turns last-bit float
 * differences (a contiguous cache's 64-key attention tiles vs a paged cache's block-sized ones)
 * into ~1e-3 logit differences, so a contiguous prefill is no oracle there (docs/batching.md
 * "q8/q4: why paths differ by ~1e-3"); a replay on the same pool is.
 */
async function mixedVsReplay(
  model: NativeModel,
  opts: { lanes: number; maxLen: number; maxChunk: number; seed: number },
): Promise<{ worst: number; rows: number }> {
  const rnd = mulberry32(opts.seed);
  const vocab = model.config.vocabSize;
  const pool = model.createKvPool(4096, 16);
  const lanes = Array.from({ length: opts.lanes }, (_, i) => ({
    ids: tokens(1 + Math.floor(rnd() * opts.maxLen), vocab, opts.seed * 100 + i),
    seq: null as NativeSequence | null,
    fed: 0,
    joinAt: Math.floor(rnd() * 6),
    chunks: [] as { n: number; logits: Float32Array | null }[],
  }));
  let worst = 0, rows = 0;
  try {
    for (let step = 0; lanes.some((l) => l.fed < l.ids.length); step++) {
      const items: BatchItem[] = [];
      const who: number[] = [];
      lanes.forEach((l, i) => {
        if (step < l.joinAt || l.fed >= l.ids.length || rnd() < 0.25) return;
        l.seq ??= pool.createSequence(l.ids.length);
        const n = Math.min(
          l.ids.length - l.fed,
          rnd() < 0.5 ? 1 : 1 + Math.floor(rnd() * opts.maxChunk),
        );
        items.push({ seq: l.seq, tokens: l.ids.slice(l.fed, l.fed + n), wantLogits: rnd() < 0.8 });
        who.push(i);
        l.fed += n;
      });
      if (items.length === 0) continue;
      const out = await logitsStep(model, items);
      out.forEach((logits, k) => lanes[who[k]].chunks.push({ n: items[k].tokens.length, logits }));
      for (const l of lanes) {
        if (l.seq && l.fed === l.ids.length) {
          l.seq.free();
          l.seq = null;
        }
      }
    }
    for (const l of lanes) {
      using seq = pool.createSequence(l.ids.length);
      let fed = 0;
      for (const c of l.chunks) {
        const [alone] = await logitsStep(model, [{
          seq,
          tokens: l.ids.slice(fed, fed + c.n),
          wantLogits: c.logits !== null,
        }]);
        fed += c.n;
        if (!c.logits || !alone) continue;
        rows++;
        worst = Math.max(worst, relDiff(c.logits, alone));
        assert.equal(argmax(c.logits), argmax(alone), `greedy token at ${fed - 1}`);
      }
    }
    assert.equal(pool.blocksFree, pool.blocksTotal, "every block back in the pool");
  } finally {
    for (const l of lanes) l.seq?.free();
    pool.free();
  }
  return { worst, rows };
}

for (const weights of ["q8", "q4"] as const) {
  Deno.test(`batchStep() gives a sequence in a mixed batch its logits alone with ${weights} weights (tiny-powerful)`, async () => {
    // The step's GEMMs take the int8 path per thread and panel range (gemm_range,
    // PreparedRows); which rows share a step must not change a row's result.
    using model = NativeModel.load(await checkpoint(DEMO_DIRS[2]), { threads: 2, weights });
    const r = await mixedVsReplay(model, { lanes: 12, maxLen: 90, maxChunk: 24, seed: 5 });
    assert.ok(r.rows > 40, `compared ${r.rows} rows`);
    assert.ok(
      r.worst <= REL_TOL,
      `${weights}: worst relative difference ${r.worst.toExponential(3)}`,
    );
  });
}

Deno.test("batchStep() matches alone with contiguous sequences and one thread (tiny-powerful)", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[2]), { threads: 1 });
  const r = await batchedVsAlone(model, {
    lanes: 6,
    maxLen: 300,
    maxChunk: 200,
    seed: 3,
    paged: false,
  });
  assert.ok(r.worst <= REL_TOL, `worst relative difference ${r.worst.toExponential(3)}`);
});

Deno.test("batchStep() matches alone and the float64 reference on the generated checkpoints", async () => {
  const root = await Deno.makeTempDir({ prefix: "kvr-batch-" });
  try {
    for (const [i, spec] of ORACLE_CASES.entries()) {
      const dir = await writeRandomCheckpoint(`${root}/${spec.name}`, spec);
      using model = NativeModel.load(await loadCheckpoint(dir), { threads: 2 });
      const r = await batchedVsAlone(model, {
        lanes: 5,
        maxLen: 40,
        maxChunk: 12,
        seed: 11 + i,
        paged: true,
      });
      assert.ok(
        r.worst <= REL_TOL,
        `${spec.name}: worst relative difference ${r.worst.toExponential(3)}`,
      );
      if (i % 3 !== 0) continue;
      // A sample against the float64 reference: two sequences, one step of a prefill chunk and
      // a decode mixed, every batched row vs the reference at the same position.
      const ref = await loadReferenceModel(dir);
      const vocab = model.config.vocabSize;
      const a = tokens(24, vocab, 5), b = tokens(9, vocab, 6);
      using pool = {
        p: model.createKvPool(64, 16),
        [Symbol.dispose]() {
          this.p.free();
        },
      };
      using sa = pool.p.createSequence(64);
      using sb = pool.p.createSequence(64);
      await sa.prefill(a.slice(0, 20));
      await sb.prefill(b.slice(0, 8));
      const [la, lb] = await logitsStep(model, [
        { seq: sa, tokens: a.slice(20), wantLogits: true },
        { seq: sb, tokens: b.slice(8), wantLogits: true },
      ]);
      for (const [ids, got] of [[a, la!], [b, lb!]] as const) {
        const want = referenceForward(ref, ids).subarray(
          (ids.length - 1) * vocab,
          ids.length * vocab,
        );
        let diff = 0, scale = 0;
        for (let t = 0; t < vocab; t++) {
          diff = Math.max(diff, Math.abs(got[t] - want[t]));
          scale = Math.max(scale, Math.abs(want[t]));
        }
        assert.ok(
          diff / scale < 1e-3,
          `${spec.name}: vs reference ${(diff / scale).toExponential(3)}`,
        );
      }
    }
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("batchStep() refuses bad batches before any work and leaves every length unchanged", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  using other = NativeModel.load(await checkpoint(DEMO_DIRS[1]), { threads: 1 });
  using a = model.createSequence(8);
  using b = model.createSequence(8);
  using c = other.createSequence(8);
  await a.prefill([1, 2]);
  const vocab = model.config.vocabSize;
  await assert.rejects(model.batchStep([]), RangeError);
  await assert.rejects(
    model.batchStep([{ seq: a, tokens: [1], wantLogits: true }, {
      seq: a,
      tokens: [2],
      wantLogits: true,
    }]),
    /appears twice/,
  );
  await assert.rejects(
    model.batchStep([{ seq: c, tokens: [1], wantLogits: true }]),
    /not a sequence of this model/,
  );
  await assert.rejects(
    model.batchStep([{ seq: b, tokens: [vocab], wantLogits: true }]),
    /tokens\[0\]/,
  );
  await assert.rejects(model.batchStep([{ seq: b, tokens: [], wantLogits: true }]), /at least one/);
  await assert.rejects(
    model.batchStep([{ seq: b, tokens: [1], wantLogits: true }, {
      seq: a,
      tokens: new Array(7).fill(1),
      wantLogits: true,
    }]),
    /capacity exceeded/,
  );
  assert.equal(a.length, 2);
  assert.equal(b.length, 0);
  b.free();
  await assert.rejects(model.batchStep([{ seq: b, tokens: [1], wantLogits: true }]), /freed/);
  // A freed sequence after a valid step: the step's result is the same as alone.
  const [l] = await logitsStep(model, [{ seq: a, tokens: [3], wantLogits: true }]);
  using alone = model.createSequence(8);
  const want = await alone.prefill([1, 2, 3]);
  assert.ok(relDiff(l!, want) <= REL_TOL);
});

// n = 4 and 6: the stage split, the step's draws then spread over the worker pool's threads
// (core/batch.cpp draw_rows); n = 36 (two groups of whole sequences, one per thread, each sampling
// its own rows: cpu/batch_forward.cpp) — every decode step here has at least 35 rows.
for (const n of [4, 6, 36]) {
  Deno.test(`batchStep() samples natively inside the step: the token the same sampler draws from the alone logits (${n} sequences)`, async () => {
    await nativeSamplingCase(n);
  });
}

async function nativeSamplingCase(n: number): Promise<void> {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 2 });
  const vocab = model.config.vocabSize;
  const pool = model.createKvPool(512, 16);
  const seqs = Array.from({ length: n }, () => pool.createSequence(64));
  const alone = Array.from({ length: n }, () => model.createSequence(64));
  // Seeded non-greedy samplers (and greedy ones): the batched one and its twin on alone logits.
  const opts = (i: number): NativeSamplingOptions => ({
    temperature: i % 6 === 0 ? 0 : 0.7 + 0.1 * (i % 6),
    topK: i % 6 === 2 ? 50 : 0,
    topP: i % 6 === 3 ? 0.9 : 1,
    minP: i % 6 === 4 ? 0.05 : 0,
    seed: 1000 + i,
  });
  const batched = seqs.map((_, i) => model.createSampler(opts(i)));
  const twins = seqs.map((_, i) => NativeSampler.create(opts(i)));
  // Each row's own logit chain too, so that rows drawn at once on different threads each work on
  // their own copy of the row, history and PRNG: a buffer or stream shared between two rows'
  // draws gives one of them another token.
  const chain = (i: number, s: NativeSampler, prompt: number[]) => {
    if (i % 4 === 1) s.setRepetitionPenalty(1.3, prompt);
    if (i % 4 === 2) s.setPresenceFrequency(0.4, 0.2);
    if (i % 4 === 3) {
      s.setLogitBias(new Map([[7, 2], [11, -3]]));
      s.setMinTokens(4, [1, 2, 3, 5, 8]);
    }
  };
  try {
    const width = vocab - 3; // ids past the width are never drawn
    let next: number[] = [];
    for (let i = 0; i < n; i++) {
      const prompt = tokens(3 + i, vocab, 70 + i);
      chain(i, batched[i], prompt);
      chain(i, twins[i], prompt);
      const [first] = await logitsStep(model, [{ seq: seqs[i], tokens: prompt, wantLogits: true }]);
      const ref = await alone[i].prefill(prompt);
      assert.ok(relDiff(first!, ref) <= REL_TOL);
      next.push(twins[i].sample(ref, width).token);
      batched[i].sample(first!, width); // keep the twin PRNG streams in step
    }
    for (let step = 0; step < 12; step++) {
      // Mixed: sequence 5 asks for logits every third step, sequence 4 sits out odd steps.
      const items: BatchItem[] = [];
      const who: number[] = [];
      for (let i = 0; i < n; i++) {
        if (i === 4 && step % 2 === 1) continue;
        const logits = i === 5 && step % 3 === 0;
        items.push({
          seq: seqs[i],
          tokens: [next[i]],
          wantLogits: logits,
          sample: logits ? undefined : { sampler: batched[i], width },
        });
        who.push(i);
      }
      const out = await model.batchStep(items);
      const upd = [...next];
      for (let k = 0; k < who.length; k++) {
        const i = who[k];
        const ref = await alone[i].decode(next[i]);
        const want = twins[i].sample(ref, width).token;
        const r = out[k];
        if (items[k].wantLogits) {
          assert.ok(r instanceof Float32Array && relDiff(r, ref) <= REL_TOL);
          batched[i].sample(r, width);
          upd[i] = want;
        } else {
          assert.equal(r, want, `sequence ${i}, step ${step}: sampled inside the step`);
          assert.ok((r as number) < width);
          upd[i] = r as number;
        }
      }
      next = upd;
    }
    for (let i = 0; i < n; i++) assert.equal(seqs[i].length, alone[i].length);
  } finally {
    for (const x of [...batched, ...twins]) x.free();
    for (const x of [...seqs, ...alone]) x.free();
    pool.free();
  }
}

/** One decode step of `seqs` (a token each) through the test library's
 *  kvr_test_batch_step_sample_serial: each row drawn by its sampler after the step, in order. */
function serialStep(
  lib: TestLibrary,
  seqs: NativeSequence[],
  samplers: NativeSampler[],
  next: number[],
  vocab: number,
): number[] {
  const n = seqs.length;
  const ptrs = new BigUint64Array(n);
  seqs.forEach((s, i) => ptrs[i] = BigInt(Deno.UnsafePointer.value(s.beginHold("serialStep"))));
  try {
    const sp = BigUint64Array.from(samplers, (s) => BigInt(Deno.UnsafePointer.value(s.pointer)));
    const out = new Int32Array(n);
    lib.check(
      lib.hooks.kvr_test_batch_step_sample_serial(
        ptrs,
        n,
        new Uint32Array(n).fill(1),
        Int32Array.from(next),
        BigInt(n),
        new Uint32Array(n),
        null,
        0n,
        sp,
        new Uint32Array(n).fill(vocab),
        out,
      ),
      "kvr_test_batch_step_sample_serial",
    );
    return [...out];
  } finally {
    for (const s of seqs) s.endHold();
  }
}

Deno.test("batchStep() draws over the worker pool give the tokens of the serial draws (4 rows, tiny-powerful)", async () => {
  // The test library's kvr_test_batch_step_sample_serial is the step with its rows drawn one after
  // another on the calling thread. Twin sequences fed the same tokens get the same logits, so each
  // step's tokens must match exactly, row by row, with each row's own sampler and logit chain.
  const lib = openTestLibrary();
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[2]), { threads: 2, lib });
  const vocab = model.config.vocabSize;
  const pool = model.createKvPool(256, 16);
  const n = 4;
  const opts = (i: number): NativeSamplingOptions => ({
    temperature: 0.7 + 0.2 * i,
    topK: 0,
    topP: i === 1 ? 0.9 : 1,
    minP: i === 2 ? 0.05 : 0,
    seed: 7 + i,
  });
  const prompts = Array.from({ length: n }, (_, i) => tokens(20 + i, vocab, 90 + i));
  const make = () =>
    prompts.map((prompt, i) => {
      const s = model.createSampler(opts(i));
      if (i !== 0) s.setRepetitionPenalty(1.3, prompt);
      if (i === 3) s.setPresenceFrequency(0.3, 0.1);
      return s;
    });
  const pooled = make(), serial = make();
  const a = prompts.map(() => pool.createSequence(96)),
    b = prompts.map(() => pool.createSequence(96));
  try {
    for (let i = 0; i < n; i++) {
      await model.batchStep([{ seq: a[i], tokens: prompts[i], wantLogits: false }]);
      await model.batchStep([{ seq: b[i], tokens: prompts[i], wantLogits: false }]);
    }
    let next = prompts.map((p) => p[0]);
    const seen = new Set<number>();
    for (let step = 0; step < 24; step++) {
      const items = (seqs: NativeSequence[], samplers: NativeSampler[]): BatchItem[] =>
        seqs.map((seq, i) => ({
          seq,
          tokens: [next[i]],
          wantLogits: false,
          sample: { sampler: samplers[i] },
        }));
      const got = await model.batchStep(items(a, pooled));
      const want = serialStep(lib, b, serial, next, vocab);
      assert.deepEqual(got, want, `step ${step}`);
      next = got.map((t) => t as number);
      next.forEach((t) => seen.add(t));
    }
    assert.ok(seen.size > n, "the rows draw varied tokens"); // a constant draw would prove nothing
  } finally {
    for (const x of [...pooled, ...serial, ...a, ...b]) x.free();
    pool.free();
  }
});

Deno.test("batchStep() refuses bad sampling items before any work", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const vocab = model.config.vocabSize;
  using a = model.createSequence(8);
  using b = model.createSequence(8);
  await a.prefill([1, 2]);
  await b.prefill([3]);
  const o = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 };
  using s = model.createSampler(o);
  await assert.rejects(
    model.batchStep([{ seq: a, tokens: [1], wantLogits: true, sample: { sampler: s } }]),
    /both wantLogits and sample/,
  );
  await assert.rejects(
    model.batchStep([{ seq: a, tokens: [1], wantLogits: false, sample: { sampler: s, width: 0 } }]),
    /width/,
  );
  await assert.rejects(
    model.batchStep([{
      seq: a,
      tokens: [1],
      wantLogits: false,
      sample: { sampler: s, width: vocab + 1 },
    }]),
    /width/,
  );
  await assert.rejects(
    model.batchStep([
      { seq: a, tokens: [1], wantLogits: false, sample: { sampler: s } },
      { seq: b, tokens: [1], wantLogits: false, sample: { sampler: s } },
    ]),
    /appears twice/,
  );
  s.free();
  await assert.rejects(
    model.batchStep([{ seq: a, tokens: [1], wantLogits: false, sample: { sampler: s } }]),
    /freed/,
  );
  assert.equal(a.length, 2);
  assert.equal(b.length, 1);
});

Deno.test("batchStep() decode-only steps run on the calling thread yet let timers fire between steps", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 2 });
  using seq = model.createSequence(400);
  await logitsStep(model, [{ seq, tokens: [1, 2, 3], wantLogits: false }]);
  // Two decodes first: the model's decode steps are then known to be short (sync from here on).
  for (let i = 0; i < 2; i++) {
    await logitsStep(model, [{ seq, tokens: [5 + i], wantLogits: false }]);
  }
  let fired = false;
  const timer = setTimeout(() => fired = true, 1);
  let steps = 0;
  while (!fired && steps < 300) {
    await logitsStep(model, [{ seq, tokens: [7], wantLogits: false }]);
    steps++;
  }
  clearTimeout(timer);
  assert.ok(fired, `a 1 ms timer did not fire during ${steps} decode steps`);
});

Deno.test("batchStep() decode steps give the same bits synchronous and nonblocking", async () => {
  // Four sequences, a prefill each, then 12 decode-only steps of all four; once with every decode
  // step nonblocking (maxBatchStepMs = 0), once with the default policy (synchronous after the
  // first); the rows must be identical, and the second run must have taken synchronous steps.
  async function run(maxBatchStepMs: number): Promise<{ rows: Float32Array[]; taken: number }> {
    const saved = syncStep.maxBatchStepMs;
    syncStep.maxBatchStepMs = maxBatchStepMs;
    const taken0 = syncStep.batchTaken;
    try {
      using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 2 });
      const seqs = [0, 1, 2, 3].map(() => model.createSequence(64));
      try {
        const toks = tokens(80, model.config.vocabSize, 11);
        await logitsStep(
          model,
          seqs.map((seq, i) => ({ seq, tokens: toks.slice(i, i + 5), wantLogits: false })),
        );
        const rows: Float32Array[] = [];
        for (let step = 0; step < 12; step++) {
          const out = await logitsStep(
            model,
            seqs.map((seq, i) => ({ seq, tokens: [toks[20 + step * 4 + i]], wantLogits: true })),
          );
          rows.push(...out.map((r) => r!));
        }
        return { rows, taken: syncStep.batchTaken - taken0 };
      } finally {
        for (const s of seqs) s.free();
      }
    } finally {
      syncStep.maxBatchStepMs = saved;
    }
  }
  const nonblocking = await run(0);
  assert.equal(nonblocking.taken, 0, "maxBatchStepMs = 0 took synchronous steps");
  const sync = await run(1000);
  assert.ok(sync.taken >= 11, `only ${sync.taken} of 12 decode steps were synchronous`);
  assert.equal(sync.rows.length, nonblocking.rows.length);
  sync.rows.forEach((r, i) => assert.deepEqual(r, nonblocking.rows[i], `row ${i}`));
});

Deno.test("batchDecodeSteps() gives the tokens and lengths of as many single batched steps", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 2 });
  const vocab = model.config.vocabSize;
  for (const n of [5, 36]) {
    const pool = model.createKvPool(1024, 16);
    const opts = (i: number): NativeSamplingOptions => ({
      temperature: i % 3 === 0 ? 0 : 0.9,
      topK: 0,
      topP: i % 3 === 2 ? 0.9 : 1,
      minP: 0,
      seed: 500 + i,
    });
    const a = Array.from({ length: n }, () => pool.createSequence(96));
    const b = Array.from({ length: n }, () => pool.createSequence(96));
    const sa = a.map((_, i) => model.createSampler(opts(i)));
    const sb = b.map((_, i) => model.createSampler(opts(i)));
    try {
      let next: number[] = [];
      for (let i = 0; i < n; i++) {
        const prompt = tokens(4 + (i % 7), vocab, 300 + i);
        await model.batchStep([{ seq: a[i], tokens: prompt, wantLogits: false }]);
        await model.batchStep([{ seq: b[i], tokens: prompt, wantLogits: false }]);
        next.push(prompt[0]);
      }
      for (const steps of [4, 1, 3]) {
        const burst = await model.batchDecodeSteps(
          a.map((seq, i) => ({ seq, token: next[i], sample: { sampler: sa[i] } })),
          steps,
        );
        const single: number[][] = b.map(() => []);
        let input = next;
        for (let s = 0; s < steps; s++) {
          const out = await model.batchStep(
            b.map((seq, i) => ({
              seq,
              tokens: [input[i]],
              wantLogits: false,
              sample: { sampler: sb[i] },
            })),
          );
          input = out.map((r) => r as number);
          input.forEach((t, i) => single[i].push(t));
        }
        for (let i = 0; i < n; i++) {
          assert.ok(burst[i] instanceof Int32Array);
          assert.deepEqual(
            Array.from(burst[i] as Int32Array),
            single[i],
            `n=${n} steps=${steps} seq ${i}`,
          );
          assert.equal(a[i].length, b[i].length);
        }
        next = input;
      }
    } finally {
      for (const x of [...sa, ...sb]) x.free();
      for (const x of [...a, ...b]) x.free();
      pool.free();
    }
  }
});

Deno.test("batchDecodeSteps() stops at the step the pool cannot hold and keeps the steps done", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 2 });
  const vocab = model.config.vocabSize;
  // 4 sequences of 14 tokens in a pool of 5 blocks of 16: step 3 (position 16) needs a second block
  // for each of them, and only one is free.
  const pool = model.createKvPool(5, 16);
  const seqs = Array.from({ length: 4 }, () => pool.createSequence(64));
  const samplers = seqs.map(() =>
    model.createSampler({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 })
  );
  try {
    for (let i = 0; i < 4; i++) {
      await model.batchStep([{
        seq: seqs[i],
        tokens: tokens(14, vocab, 900 + i),
        wantLogits: false,
      }]);
    }
    const out = await model.batchDecodeSteps(
      seqs.map((seq, i) => ({ seq, token: i + 1, sample: { sampler: samplers[i] } })),
      6,
    );
    for (let i = 0; i < 4; i++) {
      const t = out[i] as Int32Array;
      assert.equal(t.length, 2, "two steps fit (positions 14 and 15)");
      assert.equal(seqs[i].length, 16, "the first token and the first sample are in the cache");
    }
    assert.equal(pool.blocksFree, 1, "the failed step took no block");
  } finally {
    for (const s of samplers) s.free();
    for (const s of seqs) s.free();
    pool.free();
  }
});

Deno.test("batchStep() prefill on a paged sequence gives the bits of a contiguous prefill (64-key attention tiles over 16-token blocks)", async () => {
  // attention() reads a paged cache's blocks in 64-key tiles, the tiles of a contiguous cache
  // (f32 in place 8 keys at a time, bf16 gathered), so the two storages sum in the same order
  // (16-key tiles differed by ~1e-7).
  for (const kvDtype of ["f32", "bf16"] as KvDtype[]) {
    using model = NativeModel.load(await checkpoint(DEMO_DIRS[2]), { threads: 2, kvDtype });
    const pool = model.createKvPool(256, 16);
    try {
      for (const n of [17, 64, 65, 150]) {
        const ids = tokens(n, model.config.vocabSize, 40 + n);
        using paged = pool.createSequence(n);
        const [got] = await logitsStep(model, [{ seq: paged, tokens: ids, wantLogits: true }]);
        using flat = model.createSequence(n);
        const want = await flat.prefill(ids);
        assert.ok(
          got!.every((x, i) => Object.is(x, want[i])),
          `${kvDtype} n=${n}: ${relDiff(got!, want)}`,
        );
      }
    } finally {
      pool.free();
    }
  }
});
