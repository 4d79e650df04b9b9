// The scheduler on a real model: many concurrent generations through batched steps (with a pool
// small enough to force preemptions) produce exactly the tokens of each one run alone — greedy,
// and seeded sampling drawn natively inside the step.

import assert from "node:assert/strict";
import { decodeLoop, generate, loadModel } from "../engine/mod.ts";
import { Scheduler } from "./scheduler.ts";
import { nativeStepEngine } from "./native_engine.ts";

const MODELS = new URL("../../models/", import.meta.url).pathname;

for (const sampled of [false, true]) {
  Deno.test(`Scheduler + nativeStepEngine: 24 concurrent ${sampled ? "seeded sampled" : "greedy"} generations equal each run alone, also under preemption`, async () => {
    const model = await loadModel(`${MODELS}tiny-fast`, { threads: 2 });
    try {
      const prompts = Array.from(
        { length: 24 },
        (_, i) =>
          model.tokenizer.encode(
            `Request ${i}: the ${["cat", "river", "engine", "storm"][i % 4]} was`,
          ),
      );
      const opts = (i: number) =>
        sampled
          ? { maxTokens: 24, temperature: 0.9, topP: 0.95, seed: 500 + i, stopTokenIds: [] }
          : { maxTokens: 24, temperature: 0, stopTokenIds: [] as number[] };
      const alone: number[][] = [];
      for (const [i, p] of prompts.entries()) {
        alone.push((await generate(model, p, opts(i))).tokenIds);
      }
      for (const blocks of [512, 24]) { // roomy, then a pool that cannot hold everyone
        const pool = model.native.createKvPool(blocks, 16);
        const engine = nativeStepEngine(model.native, pool);
        let sampledRows = 0, logitRows = 0;
        const sched = new Scheduler({
          ...engine,
          step: (items) => {
            for (const it of items) {
              if (it.sample) sampledRows++;
              if (it.wantLogits) logitRows++;
            }
            return engine.step(items);
          },
        }, { maxStepTokens: 128 });
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
              if (s.done) return s.value.tokenIds;
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
        // Decodes sample inside the step: logits rows only end prompts (and recomputes).
        assert.ok(sampledRows >= 24 * 22, `${sampledRows} rows sampled natively`);
        assert.ok(logitRows <= 24 + sched.counters.preemptions, `${logitRows} logits rows`);
        assert.equal(pool.blocksFree, pool.blocksTotal);
        pool.free();
      }
    } finally {
      model.native.free();
    }
  });
}
