// Tests of Lane: a batched tier's generation prefills through the scheduler, and a request
// stopped (deadline, disconnect, shutdown) while its prompt waits for KV blocks leaves the
// scheduler at once instead of waiting for blocks.

import assert from "node:assert/strict";
import { loadModel } from "../engine/mod.ts";
import { Lane } from "./lane.ts";
import { nativeStepEngine } from "./native_engine.ts";
import { Scheduler, SchedulerClosedError } from "./scheduler.ts";
import type { Tier } from "./tier.ts";

const MODELS = new URL("../../models/", import.meta.url).pathname;

Deno.test("Lane.prefill() runs through the scheduler and rejects with SchedulerClosedError when its signal fires while waiting for blocks", async () => {
  const model = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  const pool = model.native.createKvPool(4, 16);
  const scheduler = new Scheduler(nativeStepEngine(model.native, pool), { watermarkBlocks: 0 });
  const tier = { model, batch: { pool, scheduler, refresh: () => {} } } as unknown as Tier;
  try {
    const a = Lane.create(tier, 64);
    const ids = Array.from({ length: 64 }, (_, i) => (i * 13) % 4000);
    const logits = await a.prefill([], ids); // the whole pool
    using alone = model.native.createSequence(64);
    const want = await alone.prefill(ids);
    let diff = 0, scale = 0;
    for (let i = 0; i < want.length; i++) {
      diff = Math.max(diff, Math.abs(logits[i] - want[i]));
      scale = Math.max(scale, Math.abs(want[i]));
    }
    assert.ok(diff / scale <= 1e-5, `paged batched prefill vs alone: ${diff / scale}`);
    const ac = new AbortController();
    const b = Lane.create(tier, 64, ac.signal);
    const waiting = b.prefill([], ids.slice(0, 20));
    setTimeout(() => ac.abort(new Error("deadline")), 30);
    await assert.rejects(waiting, SchedulerClosedError);
    await assert.rejects(
      b.prefill([], [1]),
      SchedulerClosedError,
      "a stopped lane refuses more work",
    );
    b.free();
    a.free();
    assert.equal(pool.blocksFree, 4);
  } finally {
    scheduler.close();
    model.native.free();
  }
});
