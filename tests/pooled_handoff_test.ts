// Handoffs batch on the target tier: 32 concurrent handoffs (prefill on fast with store, decode
// on powerful with migration through the demo projector) through the served apps. Oracles: the
// same handoff run alone (text for text, greedy), and both schedulers' counters — every prefill
// is a row of the source tier's batched steps and every decode of an imported sequence a row of
// the target tier's, several rows per step.
import assert from "node:assert/strict";
import { createDecodeApp } from "../functions/decode/app.ts";
import { createPrefillApp } from "../functions/prefill/app.ts";
import { post, testRuntime } from "../functions/shared/test_helpers.ts";
import type { Runtime } from "../lib/serve/mod.ts";

const SUBJECTS = ["The old lighthouse keeper", "A young cartographer", "The village baker"];
const PLACES = ["at the edge of the northern sea", "in a city of narrow bridges", "near the mill"];
const ACTS = ["kept a ledger of every ship", "drew maps of roads", "told stories", "sang"];

/** 32 distinct prompts of some 25 tokens (a mix-up between requests changes a text). */
function prompts(): string[] {
  const out: string[] = [];
  for (let i = 0; out.length < 32; i++) {
    const s = SUBJECTS[i % 3], p = PLACES[Math.floor(i / 3) % 3], a = ACTS[Math.floor(i / 9) % 4];
    out.push(`${s} who lived ${p} ${a}, and every evening after supper the neighbours came`);
  }
  return out;
}

async function handoff(rt: Runtime, prompt: string): Promise<{ text: string; migrated: boolean }> {
  const stored = await createPrefillApp(rt).request(
    "/v1/prefill",
    post({ tier: "fast", prompt, store: true }),
  );
  assert.equal(stored.status, 200);
  const { snapshot_id } = await stored.json();
  const res = await createDecodeApp(rt).request(
    "/v1/decode",
    post({ snapshot_id, tier: "powerful", max_tokens: 16, ignore_eos: true }),
  );
  assert.equal(res.status, 200, await res.clone().text());
  const body = await res.json();
  return { text: body.text, migrated: body.migrated };
}

// The demo projector is committed: its absence is a failure, not a reason to skip.
Deno.test("32 concurrent handoffs decode in the target tier's batched steps, each equal to running alone", async () => {
  const rt = await testRuntime({
    tiers: { fast: "tiny-fast", powerful: "tiny-powerful" },
    tier: { concurrency: 32, queue_depth: 32, max_new_tokens: 16 },
    config: {
      projectors: [{ from: "fast", to: "powerful", path: "projectors/tiny-fast--tiny-powerful" }],
      // Off, so every prompt token is prefilled (a run alone would otherwise cache them).
      prefix_cache: { enabled: false },
    },
  });
  try {
    const all = prompts();
    const alone: string[] = [];
    for (const p of all) {
      const r = await handoff(rt, p);
      assert.equal(r.migrated, true);
      alone.push(r.text);
    }
    const counters = rt.tiers.get("powerful")!.batch!.scheduler.counters;
    const before = { ...counters };
    const source = rt.tiers.get("fast")!.batch!.scheduler.counters;
    const sourceBefore = { ...source };
    const together = await Promise.all(all.map((p) => handoff(rt, p)));
    assert.deepEqual(together.map((r) => r.text), alone);
    // The prefills on fast (every prompt token but the last, which rides as pending) are prefill
    // rows of fast's steps, several prompts per step.
    const fast = rt.tiers.get("fast")!.model.tokenizer;
    const kv = all.reduce((n, p) => n + fast.encode(p).length - 1, 0);
    assert.equal(source.prefillTokens - sourceBefore.prefillTokens, kv);
    assert.ok(source.steps - sourceBefore.steps < 32, `${source.steps - sourceBefore.steps} steps`);
    const steps = counters.steps - before.steps;
    const decodes = counters.decodeTokens - before.decodeTokens;
    // Every token after the first of each handoff is a decode row of the scheduler (15 each; a
    // sequence decoding on a lane of its own adds none) ...
    assert.equal(decodes, 32 * 15);
    // ... and the imported sequences share steps: more than one decode row per step on average.
    assert.ok(decodes / steps > 2, `${decodes} decode rows in ${steps} steps`);
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/decode waits for the pool's KV blocks as a prompt does: 503 timeout while they are held, the same text once they are free", async () => {
  const rt = await testRuntime({ tier: { request_timeout_ms: 400 } });
  try {
    const tier = rt.tiers.get("fast")!;
    const pool = tier.batch!.pool;
    const prompt = SUBJECTS[0] + " " + PLACES[0] + " " + ACTS[0];
    const snap = new Uint8Array(
      await (await createPrefillApp(rt).request("/v1/prefill", post({ tier: "fast", prompt })))
        .arrayBuffer(),
    );
    const decode = () =>
      createDecodeApp(rt).request("/v1/decode?tier=fast&max_tokens=6", {
        method: "POST",
        headers: { "content-type": "application/vnd.kvrelay.snapshot" },
        body: snap,
      });
    const free = await decode();
    assert.equal(free.status, 200);
    const expected = (await free.json()).text;
    // Every block of the pool taken by a sequence the scheduler does not know.
    const holder = pool.createSequence(pool.blocksFree * pool.blockTokens);
    await holder.prefill(
      Array.from({ length: pool.blocksFree * pool.blockTokens }, (_, i) => i % 50),
    );
    assert.equal(pool.blocksFree, 0);
    const held = await decode();
    assert.equal(held.status, 503);
    assert.equal((await held.json()).error.type, "timeout_error");
    holder.free();
    tier.batch!.refresh();
    const again = await decode();
    assert.equal(again.status, 200);
    assert.equal((await again.json()).text, expected);
  } finally {
    await rt.close();
  }
});

Deno.test("a tier configured without batching decodes handoffs on sequences of its own, the same texts as a batching tier", async () => {
  const runtime = (batching: boolean) =>
    testRuntime({
      tiers: { fast: "tiny-fast", powerful: "tiny-powerful" },
      tier: { batching },
      config: {
        projectors: [{ from: "fast", to: "powerful", path: "projectors/tiny-fast--tiny-powerful" }],
      },
    });
  const some = prompts().slice(0, 3);
  const texts = async (rt: Runtime) => {
    const out: string[] = [];
    for (const p of some) out.push((await handoff(rt, p)).text);
    return out;
  };
  const batched = await runtime(true);
  const alone = await runtime(false);
  try {
    assert.equal(alone.tiers.get("powerful")!.batch, null);
    assert.deepEqual(await texts(alone), await texts(batched));
  } finally {
    await batched.close();
    await alone.close();
  }
});
