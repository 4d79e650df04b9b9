// Admission on a tier that batches: running requests are bounded by KV blocks, not by
// `concurrency` (32 concurrent requests share steps on a tier whose concurrency is 2, each
// answering as it does alone); `queue_depth` bounds the requests waiting to start (the next one
// gets 429 rate_limit_error with Retry-After, counted in kvrelay_queue_rejected_total); a waiting
// request whose client disconnects or whose deadline passes leaves the line (kvrelay_queue_depth).
// A migrate into a batching tier counts its KV against the pool until its stream ends. A
// reservation of every pool block makes requests wait deterministically.
import assert from "node:assert/strict";
import { decodeHeader } from "../../lib/snapshot/mod.ts";
import { createMigrateApp } from "../migrate/app.ts";
import { createPrefillApp } from "../prefill/app.ts";
import { createGenerateApp } from "./app.ts";
import { metricValue, post, testRuntime } from "../shared/test_helpers.ts";

/** Waits for `cond` (the server's own state), failing rather than hanging when it never holds. */
async function until(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 2000 && !cond(); i++) await new Promise((r) => setTimeout(r, 5));
  assert.ok(cond(), what);
}

const PROMPTS = [
  "The ship sailed on the sea",
  "Once upon a time there was",
  "The old man and the",
  "In the morning the birds",
];

Deno.test("a batching tier steps 32 concurrent requests together though its concurrency is 2; each equals its request alone", async () => {
  const rt = await testRuntime({ tier: { concurrency: 2, queue_depth: 64 } });
  try {
    const app = createGenerateApp(rt);
    const ask = async (prompt: string) => {
      const r = await app.request(
        "/v1/completions",
        post({ model: "fast", prompt, max_tokens: 48, ignore_eos: true }),
      );
      return { status: r.status, text: (await r.json()).choices?.[0]?.text as string };
    };
    const results = await Promise.all(
      Array.from({ length: 32 }, (_, i) => ask(PROMPTS[i % PROMPTS.length])),
    );
    assert.deepEqual(results.map((r) => r.status), Array(32).fill(200));
    const counters = rt.tiers.get("fast")!.batch!.scheduler.counters;
    // A slot queue would cap every step at the tier's concurrency (2). How many of the 32 share
    // one step depends on how their arrivals spread over the steps, so only "more than the
    // slots" is asserted.
    assert.ok(counters.peakRows > 2, `at most ${counters.peakRows} rows in a step`);
    for (const [i, p] of PROMPTS.entries()) {
      const alone = await ask(p);
      for (let j = i; j < 32; j += PROMPTS.length) {
        assert.equal(results[j].text, alone.text, `request ${j} equals its request alone`);
      }
    }
  } finally {
    await rt.close();
  }
});

Deno.test("queue_depth bounds the requests waiting for KV blocks: the next gets 429; a disconnect or a deadline frees its place", async () => {
  const rt = await testRuntime({ tier: { queue_depth: 2, request_timeout_ms: 60000 } });
  const tier = rt.tiers.get("fast")!;
  const batch = tier.batch!;
  try {
    const app = createGenerateApp(rt);
    const depth = () => metricValue(rt.metrics.render(), 'kvrelay_queue_depth{tier="fast"}');
    const body = { model: "fast", prompt: PROMPTS[0], max_tokens: 8 };
    const alone = await (await app.request("/v1/completions", post(body))).json();
    // Every block held back: a new prompt waits in the scheduler.
    const hold = await batch.scheduler.reserveBlocks(batch.pool.blocksTotal);
    const gone = new AbortController();
    const first = app.request("/v1/completions", { ...post(body), signal: gone.signal });
    const second = app.request("/v1/completions", post(body));
    await until(() => batch.gate.waiting === 2, "two requests waiting");
    assert.equal(depth(), 2);
    const refused = await app.request("/v1/completions", post(body));
    assert.equal(refused.status, 429);
    assert.ok(Number(refused.headers.get("retry-after")) >= 1);
    assert.equal((await refused.json()).error.type, "rate_limit_error");
    assert.equal(
      metricValue(rt.metrics.render(), 'kvrelay_queue_rejected_total{tier="fast"}'),
      1,
    );
    // The first client leaves: its place is free, so one more request may wait.
    gone.abort();
    const firstRes = await Promise.resolve(first).catch((e: unknown) => e);
    if (firstRes instanceof Response) await firstRes.body?.cancel();
    await until(() => batch.gate.waiting === 1, "the disconnected request left the line");
    assert.equal(depth(), 1);
    const third = app.request("/v1/completions", post(body));
    await until(() => batch.gate.waiting === 2, "the third request waiting");
    hold.release();
    for (const r of [await second, await third]) {
      assert.equal(r.status, 200);
      assert.equal((await r.json()).choices[0].text, alone.choices[0].text);
    }
    assert.equal(batch.gate.waiting, 0);
    assert.equal(depth(), 0);
  } finally {
    await rt.close();
  }
});

Deno.test("a request waiting for KV blocks past its deadline gets 503 timeout_error and leaves the line", async () => {
  const rt = await testRuntime({ tier: { queue_depth: 1, request_timeout_ms: 300 } });
  const batch = rt.tiers.get("fast")!.batch!;
  try {
    const app = createGenerateApp(rt);
    const hold = await batch.scheduler.reserveBlocks(batch.pool.blocksTotal);
    const res = await app.request(
      "/v1/completions",
      post({ model: "fast", prompt: PROMPTS[1], max_tokens: 4 }),
    );
    assert.equal(res.status, 503);
    assert.equal((await res.json()).error.type, "timeout_error");
    assert.equal(batch.gate.waiting, 0);
    hold.release();
    const ok = await app.request(
      "/v1/completions",
      post({ model: "fast", prompt: PROMPTS[1], max_tokens: 4 }),
    );
    assert.equal(ok.status, 200);
    await ok.body?.cancel();
  } finally {
    await rt.close();
  }
});

Deno.test("a migrate into a batching tier holds back its KV's blocks until its stream ends, waiting for them when none are free", async () => {
  const rt = await testRuntime({ tiers: { fast: "tiny-fast", fast2: "tiny-fast" } });
  const batch = rt.tiers.get("fast2")!.batch!;
  try {
    const stored = await (await createPrefillApp(rt).request(
      "/v1/prefill",
      post({ tier: "fast", prompt: PROMPTS[0].repeat(4), store: true }),
    )).json();
    const hold = await batch.scheduler.reserveBlocks(batch.pool.blocksTotal);
    const pending = createMigrateApp(rt).request(
      "/v1/migrate",
      post({ snapshot_id: stored.snapshot_id, target: "fast2" }),
    );
    await until(() => batch.gate.waiting === 1, "the migrate waits for KV blocks");
    hold.release();
    const res = await pending;
    assert.equal(res.status, 200);
    const kvTokens = Number(res.headers.get("x-kvrelay-migrated-tokens"));
    assert.ok(kvTokens > 16, `migrated ${kvTokens} tokens`);
    assert.equal(batch.gate.waiting, 0);
    assert.equal(batch.scheduler.reservedBlocks, Math.ceil(kvTokens / batch.pool.blockTokens));
    const bytes = new Uint8Array(await res.arrayBuffer());
    assert.equal(decodeHeader(bytes).header.tokenIds.length, kvTokens);
    await until(
      () => batch.scheduler.reservedBlocks === 0,
      "blocks given back at the stream's end",
    );
  } finally {
    await rt.close();
  }
});

Deno.test("a tier without batching keeps its slot queue: `concurrency` run, `queue_depth` wait, the next gets 429", async () => {
  const rt = await testRuntime({ tier: { batching: false, concurrency: 1, queue_depth: 1 } });
  const tier = rt.tiers.get("fast")!;
  assert.equal(tier.batch, null);
  try {
    const app = createGenerateApp(rt);
    const body = { model: "fast", prompt: PROMPTS[2], max_tokens: 6 };
    const alone = await (await app.request("/v1/completions", post(body))).json();
    const slot = await tier.queue!.acquire(); // the one slot, held
    const waiting = app.request("/v1/completions", post(body));
    await until(() => tier.queue!.waiting === 1, "a request waits for the slot");
    const refused = await app.request("/v1/completions", post(body));
    assert.equal(refused.status, 429);
    assert.ok(Number(refused.headers.get("retry-after")) >= 1);
    assert.equal((await refused.json()).error.type, "rate_limit_error");
    slot();
    const res = await waiting;
    assert.equal(res.status, 200);
    assert.equal((await res.json()).choices[0].text, alone.choices[0].text);
  } finally {
    await rt.close();
  }
});

Deno.test("a request that started no longer waits: with queue_depth 1, a second request is admitted while the first streams", async () => {
  const rt = await testRuntime({ tier: { queue_depth: 1, max_new_tokens: 128 } });
  const batch = rt.tiers.get("fast")!.batch!;
  try {
    const app = createGenerateApp(rt);
    const first = await app.request(
      "/v1/completions",
      post({ model: "fast", prompt: PROMPTS[3], max_tokens: 128, ignore_eos: true, stream: true }),
    );
    assert.equal(first.status, 200);
    const reader = first.body!.getReader();
    await reader.read(); // the stream is open: its prompt has been stepped
    assert.equal(batch.gate.waiting, 0);
    const second = await app.request(
      "/v1/completions",
      post({ model: "fast", prompt: PROMPTS[0], max_tokens: 4 }),
    );
    assert.equal(second.status, 200);
    await second.body?.cancel();
    await reader.cancel();
  } finally {
    await rt.close();
  }
});
