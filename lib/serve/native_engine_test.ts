// The scheduler on a real model: many concurrent generations through batched steps (with a pool
// small enough to force preemptions) produce exactly the tokens of each one run alone — greedy,
// and seeded sampling drawn natively inside the step.

import assert from "node:assert/strict";
import { decodeLoop, generate, loadModel } from "../engine/mod.ts";
import { Scheduler } from "./scheduler.ts";
import { nativeStepEngine } from "./native_engine.ts";
import { NonFiniteLogitsError } from "./errors.ts";

const MODELS = new URL("../../models/", import.meta.url).pathname;

for (const [sampled, bursts] of [[false, false], [true, false], [false, true], [true, true]]) {
  Deno.test(`Scheduler + nativeStepEngine: 24 concurrent ${sampled ? "seeded sampled" : "greedy"} generations equal each run alone, also under preemption${bursts ? ", in bursts of decode steps" : ""}`, async () => {
    const model = await loadModel(`${MODELS}tiny-fast`, { threads: 2 });
    try {
      const prompts = Array.from(
        { length: 24 },
        (_, i) =>
          model.tokenizer.encode(
            `Request ${i}: the ${["cat", "river", "engine", "storm"][i % 4]} was`,
          ),
      );
      const base = (i: number) =>
        sampled
          ? { maxTokens: 24, temperature: 0.9, topP: 0.95, seed: 500 + i, stopTokenIds: [] }
          : { maxTokens: 24, temperature: 0, stopTokenIds: [] as number[] };
      // Every third request stops on a token of its own alone run (its 7th..18th), so bursts
      // stop inside and give tokens back (rewind).
      const alone: number[][] = [];
      const stops: number[][] = [];
      for (const [i, p] of prompts.entries()) {
        const full = (await generate(model, p, base(i))).tokenIds;
        stops.push(i % 3 === 0 ? [full[6 + (i % 12)]] : []);
        alone.push((await generate(model, p, { ...base(i), stopTokenIds: stops[i] })).tokenIds);
      }
      const opts = (i: number) => ({ ...base(i), stopTokenIds: stops[i] });
      for (const blocks of [512, 24]) { // roomy, then a pool that cannot hold everyone
        const pool = model.native.createKvPool(blocks, 16);
        const engine = nativeStepEngine(model.native, pool);
        let sampledRows = 0, logitRows = 0, engineSteps = 0, engineRows = 0;
        const sched = new Scheduler({
          ...engine,
          step: (items) => {
            engineSteps++;
            engineRows += items.length;
            for (const it of items) {
              if (it.sample) sampledRows++;
              if (it.wantLogits) logitRows++;
            }
            return engine.step(items);
          },
          decodeSteps: async (items, steps) => {
            const out = await engine.decodeSteps!(items, steps);
            // Every row of a burst runs each of its steps (no row fails to draw here).
            const ran = Math.max(...out.map((r) => r instanceof Int32Array ? r.length : 1));
            engineSteps += ran;
            engineRows += items.length * ran;
            for (const r of out) sampledRows += r instanceof Int32Array ? r.length : 1;
            return out;
          },
        }, { maxStepTokens: 128, maxDecodeSteps: bursts ? 4 : 1, burstMs: 1e6 });
        const lengths: [number, number][] = [];
        const got = await Promise.all(prompts.map(async (p, i) => {
          const seq = pool.createSequence(p.length + 24);
          const h = sched.attach(seq);
          try {
            const first = await h.prefill(p);
            const loop = decodeLoop(h, first, {
              tokenizer: model.tokenizer,
              eosTokenIds: model.eosTokenIds,
              contextIds: p,
              promptTokens: p.length,
              startMs: performance.now(),
            }, opts(i));
            while (true) {
              const s = await loop.next();
              if (s.done) {
                // Every generated token but the last is in the cache, bursts or not.
                lengths.push([seq.length, p.length + s.value.tokenIds.length - 1]);
                return s.value.tokenIds;
              }
            }
          } finally {
            h.detach();
            seq.free();
          }
        }));
        got.forEach((ids, i) =>
          assert.deepEqual(ids, alone[i], `request ${i} with ${blocks} blocks`)
        );
        assert.ok(
          sched.counters.steps < 24 * 24 / 2,
          `${sched.counters.steps} steps for 24×24 tokens`,
        );
        if (blocks === 24) assert.ok(sched.counters.preemptions > 0, "the small pool preempted");
        for (const [got, want] of lengths) assert.equal(got, want, "sequence length at the end");
        if (bursts && blocks === 512) {
          // ~22 decode steps per request: several bursts of 4 (3 steps past the first each).
          assert.ok(sched.counters.burstSteps >= 9, `${sched.counters.burstSteps} steps in bursts`);
        }
        if (!bursts) assert.equal(sched.counters.burstSteps, 0);
        // The counters agree with what the engine ran (a burst's rows once per step).
        assert.equal(sched.counters.steps, engineSteps, "steps counted");
        assert.equal(sched.counters.rows, engineRows, "rows counted");
        assert.ok(sched.counters.engineMs > 0, "time inside the engine's calls counted");
        // Decodes sample inside the step: logits rows only end prompts (and recomputes).
        const decodeRows = alone.reduce((a, t) => a + t.length - 1, 0);
        assert.ok(
          sampledRows >= decodeRows - 24,
          `${sampledRows} of ${decodeRows} rows sampled natively`,
        );
        assert.ok(logitRows <= 24 + sched.counters.preemptions, `${logitRows} logits rows`);
        assert.equal(pool.blocksFree, pool.blocksTotal);
        pool.free();
      }
    } finally {
      model.native.free();
    }
  });
}

Deno.test("nativeStepEngine: a sampled row without a finite logit is that item's NonFiniteLogitsError in a step and a burst; the other items go on", async () => {
  const model = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  try {
    const pool = model.native.createKvPool(64, 16);
    const engine = nativeStepEngine(model.native, pool);
    const prompt = model.tokenizer.encode("The river ran");
    const [bad, good] = [pool.createSequence(64), pool.createSequence(64)];
    await engine.step([bad, good].map((seq) => ({ seq, tokens: prompt, wantLogits: false })));
    // NaN keys in every position of the first layer: every later score, and so every logit, NaN.
    const { k, v } = bad.readKv(0, 0, prompt.length, "f32");
    new Float32Array(k.buffer).fill(NaN);
    bad.writeKv(0, 0, prompt.length, k, v, "f32");
    const sampler = () => ({
      sampler: engine.createSampler!({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 }),
    });
    const out = await engine.step([
      { seq: bad, tokens: [prompt[0]], wantLogits: false, sample: sampler() },
      { seq: good, tokens: [prompt[0]], wantLogits: false, sample: sampler() },
    ]);
    assert.ok(out[0] instanceof NonFiniteLogitsError, String(out[0]));
    assert.match(out[0].message, /no finite logit among \d+ values.*overflow/);
    assert.equal(typeof out[1], "number");
    const burst = await engine.decodeSteps!([
      { seq: bad, tokens: [prompt[1]], wantLogits: false, sample: sampler() },
      { seq: good, tokens: [out[1] as number], wantLogits: false, sample: sampler() },
    ], 3);
    assert.ok(burst[0] instanceof NonFiniteLogitsError, String(burst[0]));
    assert.ok(burst[1] instanceof Int32Array && burst[1].length >= 1);
    // A row handed to JavaScript (logprobs) fails the same way.
    const row = await engine.step([{ seq: bad, tokens: [prompt[2]], wantLogits: true }]);
    assert.throws(
      () => engine.sampleRow!(sampler().sampler, row[0] as Float32Array, undefined, {}),
      NonFiniteLogitsError,
    );
    bad.free();
    good.free();
    pool.free();
  } finally {
    model.native.free();
  }
});
