// Tests for NativeModel.loadAsync: the native load runs off the JS thread (timers keep firing
// while weights are converted and packed, where the synchronous load() stops them for its whole
// duration), the model it makes computes the same logits, and failures carry the native message
// although it was recorded on a worker thread. Needs the built library.

import assert from "node:assert/strict";
import { loadCheckpoint } from "../model/mod.ts";
import { writeRandomCheckpoint } from "../../tests/fixtures/random_checkpoint.ts";
import { NativeModel } from "./model.ts";
import { EngineError } from "./errors.ts";
import { checkpoint, DEMO_DIRS } from "./test_helpers.ts";

/** Longest stretch (ms) without a timer tick between `from` and `to`. */
function longestGap(ticks: number[], from: number, to: number): number {
  const ts = [from, ...ticks.filter((t) => t > from && t < to), to];
  let gap = 0;
  for (let i = 1; i < ts.length; i++) gap = Math.max(gap, ts[i] - ts[i - 1]);
  return gap;
}

Deno.test("`NativeModel.loadAsync()` keeps timers running while weights load; `load()` blocks them", async () => {
  const dir = await Deno.makeTempDir({ prefix: "kvr_load_async_" });
  try {
    // F16 weights are widened to f32 and packed: enough native work to see (about 40 MB).
    await writeRandomCheckpoint(dir, {
      name: "load-async",
      architecture: "LlamaForCausalLM",
      vocab: 512,
      hidden: 512,
      intermediate: 1536,
      layers: 6,
      heads: 8,
      kvHeads: 4,
      dtype: "F16",
      tie: false,
      seed: 7,
      withTokenizer: false,
    });
    const ckpt = await loadCheckpoint(dir);
    const ticks: number[] = [];
    const timer = setInterval(() => ticks.push(performance.now()), 1);
    try {
      await new Promise((r) => setTimeout(r, 20));
      const s0 = performance.now();
      const sync = NativeModel.load(ckpt, { threads: 1 });
      const s1 = performance.now();
      await new Promise((r) => setTimeout(r, 20));
      const a0 = performance.now();
      const asyncModel = await NativeModel.loadAsync(ckpt, { threads: 1 });
      const a1 = performance.now();
      try {
        const syncGap = longestGap(ticks, s0, s1);
        const asyncGap = longestGap(ticks, a0, a1);
        assert.ok(s1 - s0 >= 30, `load took ${s1 - s0} ms: too short to tell`);
        // The synchronous load is one uninterrupted stretch; the asynchronous one lets the timer
        // run throughout (gaps are scheduling noise, far below the load's duration).
        assert.ok(syncGap >= 0.9 * (s1 - s0), `sync gap ${syncGap} of ${s1 - s0} ms`);
        assert.ok(asyncGap < 0.5 * (a1 - a0), `async gap ${asyncGap} of ${a1 - a0} ms`);
        // Same weights, same logits.
        const a = sync.createSequence(8);
        const b = asyncModel.createSequence(8);
        assert.deepEqual(await b.prefill([1, 2, 3]), await a.prefill([1, 2, 3]));
      } finally {
        sync.free();
        asyncModel.free();
      }
    } finally {
      clearInterval(timer);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("`NativeModel.loadAsync()` throws EngineError with the native message for a missing file", async () => {
  const ckpt = await checkpoint(DEMO_DIRS[0]);
  const missing = "/nonexistent/model.safetensors";
  const tensors = new Map([...ckpt.tensors].map(([k, t]) => [k, { ...t, file: missing }]));
  await assert.rejects(
    NativeModel.loadAsync({ ...ckpt, tensors, files: [missing] }),
    (e: unknown) => {
      assert.ok(e instanceof EngineError, `expected EngineError, got ${e}`);
      assert.equal(e.codeName, "IO");
      assert.match(e.message, /nonexistent/);
      return true;
    },
  );
});
