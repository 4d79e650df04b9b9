// Tests of the paged KV pool (KvPool, paged NativeSequence): blocks taken as sequences grow and
// returned on truncate/free, exhaustion refused all-or-none without touching running sequences,
// fragmentation after many join/leave cycles, KV read/write across block boundaries, snapshot
// export/import and cross-model migration on paged sequences.

import assert from "node:assert/strict";
import { loadModel } from "../engine/mod.ts";
import { endpointOf, loadProjector, migrateKv } from "../migrate/mod.ts";
import { exportSnapshot, importSnapshot } from "../snapshot/mod.ts";
import { EngineError, NativeModel } from "./mod.ts";
import { checkpoint, DEMO_DIRS, relDiff, tokens } from "./test_helpers.ts";
import { mulberry32 } from "../../tests/fixtures/random_checkpoint.ts";

const MODELS = new URL("../../models/", import.meta.url).pathname;

Deno.test("KvPool: a paged sequence takes a block per 16 tokens and gives them back on truncate and free", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const pool = model.createKvPool(10, 16);
  assert.equal(pool.blocksTotal, 10);
  assert.equal(pool.blockTokens, 16);
  const c = model.config;
  assert.equal(pool.blockBytes, 2 * c.numLayers * c.numKvHeads * 16 * c.headDim * 4);
  const seq = pool.createSequence(1000);
  assert.equal(seq.blocks, 0);
  await seq.prefill(tokens(17, c.vocabSize, 1));
  assert.equal(seq.blocks, 2);
  assert.equal(pool.blocksFree, 8);
  for (let i = 0; i < 15; i++) await seq.decode(5);
  assert.equal(seq.length, 32);
  assert.equal(seq.blocks, 2);
  await seq.decode(5);
  assert.equal(seq.blocks, 3);
  seq.truncate(16);
  assert.equal(seq.blocks, 1);
  assert.equal(pool.blocksFree, 9);
  seq.free();
  assert.equal(pool.blocksFree, 10);
  assert.equal(pool.freed, false);
  pool.free();
  assert.equal(pool.freed, true);
  assert.throws(() => pool.blocksFree, /has been freed/);
});

Deno.test("KvPool: exhaustion mid-decode fails the step all-or-none and running sequences stay intact", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[1]), { threads: 1 });
  const vocab = model.config.vocabSize;
  const pool = model.createKvPool(4, 16);
  const a = pool.createSequence(256), b = pool.createSequence(256);
  const ia = tokens(32, vocab, 2), ib = tokens(16, vocab, 3);
  await a.prefill(ia); // 2 blocks, full
  await b.prefill(ib); // 1 block, full
  assert.equal(pool.blocksFree, 1);
  // Both need a block for their next token; only one is free: the step fails as a whole.
  await assert.rejects(
    model.batchStep([{ seq: a, tokens: [7], wantLogits: true }, {
      seq: b,
      tokens: [8],
      wantLogits: true,
    }]),
    (e) =>
      e instanceof EngineError && e.codeName === "POOL_EXHAUSTED" && /exhausted/.test(e.message),
  );
  assert.equal(a.length, 32);
  assert.equal(b.length, 16);
  assert.equal(pool.blocksFree, 1, "the block taken for the first sequence went back");
  await assert.rejects(
    b.prefill(tokens(20, vocab, 4)),
    (e) => e instanceof EngineError && e.codeName === "POOL_EXHAUSTED",
  );
  assert.equal(b.length, 16);
  // Preempting b (free) lets a continue; a's logits equal running it alone.
  b.free();
  const [la] = await model.batchStep([{ seq: a, tokens: [7], wantLogits: true }]);
  using alone = model.createSequence(64);
  const want = await alone.prefill([...ia, 7]);
  assert.ok(la instanceof Float32Array && relDiff(la, want) <= 1e-5);
  a.free();
  assert.equal(pool.blocksFree, 4);
  pool.free();
});

Deno.test("KvPool: many join/leave cycles fragment the pool without leaking and results stay exact", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const vocab = model.config.vocabSize;
  const pool = model.createKvPool(40, 16);
  const rnd = mulberry32(9);
  const live: { seq: ReturnType<typeof pool.createSequence>; ids: number[] }[] = [];
  for (let cycle = 0; cycle < 300; cycle++) {
    if (live.length > 0 && (rnd() < 0.45 || pool.blocksFree < 4)) {
      const i = Math.floor(rnd() * live.length);
      live[i].seq.free(); // leave (or abort) at a random point
      live.splice(i, 1);
      continue;
    }
    const ids = tokens(1 + Math.floor(rnd() * 40), vocab, cycle);
    const seq = pool.createSequence(256);
    await seq.prefill(ids);
    live.push({ seq, ids });
    if (live.length > 1 && rnd() < 0.5) {
      const [x, y] = [live[0], live[live.length - 1]];
      const t = Math.floor(rnd() * vocab);
      if (x.seq.length + 1 <= 256 && pool.blocksFree >= 2) {
        await model.batchStep([{ seq: x.seq, tokens: [t], wantLogits: false }, {
          seq: y.seq,
          tokens: [t],
          wantLogits: false,
        }]);
        x.ids.push(t);
        y.ids.push(t);
      }
    }
    const held = live.reduce((n, l) => n + l.seq.blocks, 0);
    assert.equal(held + pool.blocksFree, pool.blocksTotal, `cycle ${cycle}: blocks conserved`);
  }
  // Survivors (their blocks scattered over the arena) decode exactly like a fresh sequence.
  for (const l of live) {
    const got = await l.seq.decode(3);
    using alone = model.createSequence(300);
    const want = await alone.prefill([...l.ids, 3]);
    assert.ok(relDiff(got, want) <= 1e-5);
    l.seq.free();
  }
  assert.equal(pool.blocksFree, pool.blocksTotal, "no block leaked");
  pool.free();
});

Deno.test("KvPool: a freed sequence whose batch step is in flight gives its blocks back when the step settles", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const pool = model.createKvPool(8, 16);
  const s = pool.createSequence(64);
  const step = model.batchStep([{
    seq: s,
    tokens: tokens(40, model.config.vocabSize, 5),
    wantLogits: true,
  }]);
  s.free(); // an abort while the step runs
  await step;
  assert.equal(pool.blocksFree, 8);
  pool.free();
});

Deno.test("KvPool: writeKv/readKv across block boundaries round-trip bit-exactly; setLength takes blocks", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[1]), { threads: 1 });
  const c = model.config;
  const pool = model.createKvPool(5, 16);
  using seq = pool.createSequence(96);
  const count = 45;
  const bytes = c.numKvHeads * count * c.headDim * 4;
  const rnd = mulberry32(4);
  const layers = [];
  for (let l = 0; l < c.numLayers; l++) {
    const k = new Float32Array(bytes / 4).map(() => rnd() - 0.5);
    const v = new Float32Array(bytes / 4).map(() => rnd() - 0.5);
    layers.push({ k: new Uint8Array(k.buffer), v: new Uint8Array(v.buffer) });
    seq.writeKv(l, 0, count, layers[l].k, layers[l].v, "f32");
  }
  assert.equal(seq.blocks, 3);
  seq.setLength(count);
  for (let l = 0; l < c.numLayers; l++) {
    const got = seq.readKv(l, 0, count, "f32");
    assert.deepEqual(got.k, layers[l].k);
    assert.deepEqual(got.v, layers[l].v);
    const part = seq.readKv(l, 13, 20, "f32"); // straddles the first block boundary
    const off = 13 * c.headDim * 4;
    assert.deepEqual(
      part.k.subarray(0, 20 * c.headDim * 4),
      layers[l].k.subarray(off, off + 20 * c.headDim * 4),
    );
  }
  assert.throws(
    () => seq.setLength(96),
    (e) => e instanceof EngineError && e.codeName === "POOL_EXHAUSTED",
  );
  assert.equal(seq.length, count);
  pool.free();
});

Deno.test("KvPool: snapshot export from a paged sequence and import into one keep the KV bit-exact", async () => {
  const model = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  try {
    const pool = model.native.createKvPool(64, 16);
    using src = pool.createSequence(200);
    const ids = tokens(70, model.native.config.vocabSize, 8);
    await src.prefill(ids);
    const bytes = await exportSnapshot(model, src, { tokens: ids, chunkTokens: 32 });
    const imp = await importSnapshot(model, bytes, {
      reserve: 8,
      createSequence: (n) => pool.createSequence(n),
    });
    try {
      assert.equal(imp.sequence.length, 70);
      assert.equal(imp.sequence.blocks, 5);
      for (let l = 0; l < model.native.config.numLayers; l++) {
        assert.deepEqual(imp.sequence.readKv(l, 0, 70), src.readKv(l, 0, 70));
      }
      const a = await src.decode(9), b = await imp.sequence.decode(9);
      assert.deepEqual(a, b);
    } finally {
      imp.sequence.free();
    }
    assert.equal(pool.blocksFree, 64 - 5);
    pool.free();
  } finally {
    model.native.free();
  }
});

Deno.test("KvPool: linear migration into a paged target writes the same KV as into a contiguous one", async () => {
  const fast = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  const powerful = await loadModel(`${MODELS}tiny-powerful`, { threads: 1 });
  const projector = await loadProjector(
    `${MODELS}projectors/tiny-fast--tiny-powerful`,
    endpointOf(fast),
    endpointOf(powerful),
  );
  try {
    using src = fast.native.createSequence(64);
    await src.prefill(tokens(50, fast.native.config.vocabSize, 12));
    const pool = powerful.native.createKvPool(16, 16);
    using paged = pool.createSequence(64);
    using flat = powerful.native.createSequence(64);
    for (const targetSeq of [paged, flat]) {
      await migrateKv({
        source: endpointOf(fast),
        sourceSeq: src,
        target: endpointOf(powerful),
        targetSeq,
        projector,
        count: 50,
      });
    }
    assert.equal(paged.blocks, 4);
    for (let l = 0; l < powerful.native.config.numLayers; l++) {
      assert.deepEqual(paged.readKv(l, 0, 50), flat.readKv(l, 0, 50));
    }
    pool.free();
  } finally {
    await projector.free();
    fast.native.free();
    powerful.native.free();
  }
});
