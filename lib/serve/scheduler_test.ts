// Unit tests of the Scheduler against a fake engine whose "logits" are a hash of every token in
// a sequence's cache: a result equals running alone iff the cache holds exactly the request's
// tokens in order, which is what batching, chunking and preempt-and-recompute must preserve.

import assert from "node:assert/strict";
import {
  Scheduler,
  SchedulerClosedError,
  type StepEngine,
  type StepItem,
  type StepStats,
} from "./scheduler.ts";

interface FakeSeq {
  id: number;
  tokens: number[];
  blocks: number;
  freed: boolean;
}

function hash(tokens: readonly number[]): number {
  let h = 2166136261;
  for (const t of tokens) h = Math.imul(h ^ t, 16777619) >>> 0;
  return h & 0xffffff; // exact in a float32
}

/** A paged engine in TS: blocks per sequence, all-or-none growth, step logs. */
class FakeEngine implements StepEngine<FakeSeq> {
  readonly blockTokens: number;
  readonly blocksTotal: number;
  #free: number;
  readonly steps: StepItem<FakeSeq>[][] = [];
  failNext: Error | null = null;
  #n = 0;
  constructor(blocks: number, blockTokens = 4) {
    this.blocksTotal = this.#free = blocks;
    this.blockTokens = blockTokens;
  }
  create(): FakeSeq {
    return { id: this.#n++, tokens: [], blocks: 0, freed: false };
  }
  free(s: FakeSeq): void {
    this.#free += s.blocks;
    s.blocks = 0;
    s.freed = true;
  }
  blocksFree(): number {
    return this.#free;
  }
  blocksHeld(s: FakeSeq): number {
    return s.blocks;
  }
  length(s: FakeSeq): number {
    return s.tokens.length;
  }
  reset(s: FakeSeq): void {
    this.#free += s.blocks;
    s.blocks = 0;
    s.tokens = [];
  }
  async step(items: StepItem<FakeSeq>[]): Promise<(Float32Array | null)[]> {
    await new Promise((r) => setTimeout(r, 0));
    if (this.failNext) {
      const e = this.failNext;
      this.failNext = null;
      throw e;
    }
    let need = 0;
    for (const it of items) {
      assert.ok(!it.seq.freed, "a freed sequence is never stepped");
      need += Math.max(
        0,
        Math.ceil((it.seq.tokens.length + it.tokens.length) / this.blockTokens) - it.seq.blocks,
      );
    }
    if (need > this.#free) throw new Error(`fake pool exhausted: need ${need}, free ${this.#free}`);
    this.steps.push(items.map((it) => ({ ...it, tokens: [...it.tokens] })));
    return items.map((it) => {
      it.seq.tokens.push(...it.tokens);
      const blocks = Math.ceil(it.seq.tokens.length / this.blockTokens);
      this.#free -= blocks - it.seq.blocks;
      it.seq.blocks = blocks;
      return it.wantLogits ? new Float32Array([hash(it.seq.tokens)]) : null;
    });
  }
}

function ids(n: number, seed: number): number[] {
  return Array.from({ length: n }, (_, i) => (seed * 131 + i * 7) % 1000);
}

/** A request: prefill, then `decodes` greedy-like steps feeding a token derived from the logits. */
async function request(
  sched: Scheduler<FakeSeq>,
  eng: FakeEngine,
  prompt: number[],
  decodes: number,
): Promise<number[]> {
  const seq = eng.create();
  const h = sched.attach(seq);
  const all = [...prompt];
  const seen: number[] = [];
  try {
    let logits = await h.prefill(prompt);
    for (let i = 0; i < decodes; i++) {
      assert.equal(logits[0], hash(all), "logits equal the request alone");
      seen.push(logits[0]);
      const next = logits[0] % 997;
      all.push(next);
      logits = await h.decode(next);
    }
    assert.equal(logits[0], hash(all));
    return seen;
  } finally {
    h.detach();
    eng.free(seq);
  }
}

Deno.test("Scheduler runs concurrent decodes in one step each and every result equals running alone", async () => {
  const eng = new FakeEngine(1000);
  const sched = new Scheduler(eng, { maxStepTokens: 512 });
  await Promise.all(Array.from({ length: 8 }, (_, i) => request(sched, eng, ids(5 + i, i), 12)));
  const decodeSteps = eng.steps.filter((s) => s.every((it) => it.tokens.length === 1));
  assert.ok(
    decodeSteps.length >= 10 && decodeSteps.length <= 14,
    `${decodeSteps.length} decode steps`,
  );
  assert.ok(
    decodeSteps.filter((s) => s.length === 8).length >= 10,
    "most decode steps carry all 8",
  );
  assert.equal(eng.blocksFree(), eng.blocksTotal);
});

Deno.test("Scheduler chunks a long prompt so running decodes advance every step (bounded tokens per step)", async () => {
  const eng = new FakeEngine(2000);
  const sched = new Scheduler(eng, { maxStepTokens: 64 });
  const decoders = Array.from({ length: 4 }, (_, i) => request(sched, eng, ids(3, i), 40));
  await new Promise((r) => setTimeout(r, 20));
  const long = request(sched, eng, ids(1000, 99), 1);
  await Promise.all([...decoders, long]);
  for (const s of eng.steps) {
    assert.ok(s.reduce((n, it) => n + it.tokens.length, 0) <= 64, "step token budget");
  }
  const chunkSteps = eng.steps.filter((s) =>
    s.some((it) => it.tokens.length > 1 && it.tokens.length >= 50)
  );
  assert.ok(chunkSteps.length >= 15, `prompt split over ${chunkSteps.length} steps`);
  // While the long prompt was being prefilled, the 4 decoders were in every step.
  const during = chunkSteps.filter((s) => s.length === 5);
  assert.ok(
    during.length >= chunkSteps.length - 2,
    `${during.length}/${chunkSteps.length} chunk steps carry all decoders`,
  );
});

Deno.test("Scheduler preempts the youngest sequence when the pool runs dry and recomputes it exactly", async () => {
  const eng = new FakeEngine(24, 4); // 96 positions for 6 requests of up to ~38 tokens
  const preempts: number[] = [];
  const stats: StepStats[] = [];
  const sched = new Scheduler(eng, { maxStepTokens: 64, watermarkBlocks: 1 }, {
    onPreempt: () => preempts.push(1),
    onStep: (s) => stats.push(s),
  });
  await Promise.all(
    Array.from({ length: 6 }, (_, i) => request(sched, eng, ids(6 + i, i + 10), 30)),
  );
  assert.ok(sched.counters.preemptions > 0, "the pool was too small: some sequence was preempted");
  assert.equal(preempts.length, sched.counters.preemptions);
  assert.ok(stats.every((s) => s.blocksUsed + s.blocksFree === 24));
  assert.equal(eng.blocksFree(), eng.blocksTotal, "no block leaked");
});

Deno.test("Scheduler keeps first come first served: a prompt waiting for blocks is not overtaken", async () => {
  const eng = new FakeEngine(10, 4);
  const sched = new Scheduler(eng, { maxStepTokens: 100, watermarkBlocks: 0 });
  const order: string[] = [];
  const holder = eng.create();
  const hh = sched.attach(holder);
  await hh.prefill(ids(24, 1)); // 6 of 10 blocks
  const big = sched.attach(eng.create()).prefill(ids(30, 2)).then(() => order.push("big")); // needs 8
  await new Promise((r) => setTimeout(r, 5));
  const small = sched.attach(eng.create()).prefill(ids(3, 3)).then(() => order.push("small")); // 1 would fit
  await new Promise((r) => setTimeout(r, 30));
  assert.deepEqual(order, [], "the small prompt waits behind the big one");
  hh.detach();
  eng.free(holder);
  await Promise.all([big, small]);
  assert.deepEqual(order, ["big", "small"]);
});

Deno.test("Scheduler: detach rejects pending work, and the blocks freed are reused at the next step", async () => {
  const eng = new FakeEngine(8, 4);
  const sched = new Scheduler(eng, { watermarkBlocks: 0 });
  const a = eng.create();
  const ha = sched.attach(a);
  await ha.prefill(ids(32, 1)); // the whole pool
  const pb = sched.attach(eng.create()).prefill(ids(8, 2)); // waits for blocks
  const hc = sched.attach(eng.create());
  const pc = hc.prefill(ids(4, 3)); // waits behind b
  await new Promise((r) => setTimeout(r, 10));
  hc.detach(); // its client went away while queued
  await assert.rejects(pc, SchedulerClosedError);
  ha.detach(); // a finished: its blocks go back
  eng.free(a);
  assert.equal((await pb)[0], hash(ids(8, 2)));
  assert.equal(eng.blocksFree(), 6);
});

Deno.test("Scheduler rejects a work larger than the whole pool and fails only the works of a failed step", async () => {
  const eng = new FakeEngine(4, 4);
  const sched = new Scheduler(eng, { watermarkBlocks: 0 });
  const big = sched.attach(eng.create());
  await assert.rejects(big.prefill(ids(17, 1)), /needs more than the pool's 4 blocks/);
  big.detach();
  eng.failNext = new Error("engine broke");
  const h = sched.attach(eng.create());
  await assert.rejects(h.prefill(ids(3, 2)), /engine broke/);
  assert.equal((await h.prefill(ids(3, 2)))[0], hash(ids(3, 2)), "the sequence is usable after");
  await assert.rejects(h.prefill([]), RangeError);
  sched.close();
  await assert.rejects(h.decode(1), SchedulerClosedError);
});

Deno.test("Scheduler.reserveBlocks() waits first come first served for free blocks, and the steps leave reserved blocks alone", async () => {
  const eng = new FakeEngine(10, 4);
  const sched = new Scheduler(eng, { maxStepTokens: 100, watermarkBlocks: 0 });
  const holder = eng.create();
  const hh = sched.attach(holder);
  await hh.prefill(ids(24, 1)); // 6 of 10 blocks
  const order: string[] = [];
  const big = sched.reserveBlocks(6).then((r) => (order.push("big"), r));
  const small = sched.reserveBlocks(1).then((r) => (order.push("small"), r));
  const stop = new AbortController();
  const gone = sched.reserveBlocks(1, stop.signal);
  await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(order, [], "6 blocks are not free; the 1-block one waits behind");
  stop.abort();
  await assert.rejects(gone, SchedulerClosedError);
  hh.detach();
  eng.free(holder);
  sched.blocksReleased();
  const [rb, rs] = await Promise.all([big, small]);
  assert.deepEqual(order, ["big", "small"]);
  assert.equal(sched.reservedBlocks, 7);
  // A prompt of 4 blocks finds 10 free in the pool but only 3 unreserved: it waits.
  let ran = false;
  const prompt = sched.attach(eng.create()).prefill(ids(16, 2)).then((l) => (ran = true, l));
  await new Promise((r) => setTimeout(r, 30));
  assert.equal(ran, false, "the steps do not take reserved blocks");
  rb.release();
  rb.release(); // idempotent
  assert.equal(sched.reservedBlocks, 1);
  assert.equal((await prompt)[0], hash(ids(16, 2)));
  rs.release();
  await assert.rejects(sched.reserveBlocks(11), /more than the pool's 10/);
  sched.close();
  await assert.rejects(sched.reserveBlocks(1), SchedulerClosedError);
});

Deno.test("ScheduledSequence.state follows its request: waiting, prefilling over chunks, idle, decoding, preempted, finished", async () => {
  const eng = new FakeEngine(7, 4);
  const handles: { state: string }[] = [];
  const seen: string[] = [];
  const preempted: string[][] = [];
  const sched = new Scheduler(eng, { maxStepTokens: 8, watermarkBlocks: 0 }, {
    onStep: () => seen.push(handles[0].state),
    onPreempt: () => preempted.push(handles.map((h) => h.state)),
  });
  const old = eng.create();
  const h = sched.attach(old);
  handles.push(h);
  assert.equal(h.state, "idle");
  const first = h.prefill(ids(20, 1)); // 8 + 8 + 4 tokens, 5 blocks
  assert.equal(h.state, "waiting");
  await first;
  assert.deepEqual(seen, ["prefilling", "prefilling", "idle"]);
  const next = h.decode(1); // 21 tokens: a sixth block
  assert.equal(h.state, "decoding");
  await next;
  assert.equal(h.state, "idle");
  const y = sched.attach(eng.create());
  handles.push(y);
  await y.prefill(ids(4, 2)); // the seventh and last block
  for (const t of [2, 3, 4]) await h.decode(t); // 24 tokens: the old sequence's blocks are full
  // Both need a block and none is free: the younger one, waiting on its decode, is preempted.
  const hDone = h.decode(5);
  const yDone = y.decode(9);
  await hDone;
  assert.deepEqual(preempted, [["decoding", "preempted"]]);
  assert.equal(y.state, "preempted", "it waits for blocks to recompute");
  h.detach();
  eng.free(old);
  assert.equal(h.state, "finished");
  assert.equal((await yDone)[0], hash([...ids(4, 2), 9]), "recomputed exactly");
  sched.close();
  assert.equal(y.state, "finished");
});

Deno.test("attach(onStart) is called once, when the sequence's first row is stepped, not while it waits for blocks", async () => {
  const eng = new FakeEngine(8, 4);
  const sched = new Scheduler(eng, { gatherMs: 0, watermarkBlocks: 0 });
  const hold = await sched.reserveBlocks(8);
  let starts = 0;
  const h = sched.attach(eng.create(), [], () => starts++);
  const logits = h.prefill(ids(6, 1));
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(starts, 0, "no row while every block is held back");
  assert.equal(h.state, "waiting");
  hold.release();
  await logits;
  assert.equal(starts, 1);
  await h.decode(5);
  assert.equal(starts, 1, "called once");
  assert.equal(sched.counters.peakRows, 1);
  h.detach();
  sched.close();
});
