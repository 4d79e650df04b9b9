// The prefix cache inside the KV pool, through /v1/completions: a request sharing a finished
// request's prefix adopts its pool blocks (no KV copied, a metric says so) and answers exactly as a
// server without the cache would; another tenant reuses nothing; cached blocks no request uses are
// evicted when the pool needs them (by a prompt or a snapshot import), before admission refuses.

import assert from "node:assert/strict";
import type { Runtime } from "../../lib/serve/mod.ts";
import { generate } from "../../lib/engine/mod.ts";
import { createDecodeApp } from "../decode/app.ts";
import { createPrefillApp } from "../prefill/app.ts";
import { createGenerateApp } from "./app.ts";
import { metricValue, post, testRuntime } from "../shared/test_helpers.ts";

/** A 300-token prefix (ids well inside the demo vocabulary) and two different tails. */
const prefix = Array.from({ length: 300 }, (_, i) => 100 + ((i * 37) % 900));
const tailA = [11, 12, 13, 14, 15, 16, 17];
const tailB = [21, 22, 23, 24, 25];

type Body = Record<string, unknown>;

/** A completion's text and tokens (compared exactly) and its token logprobs. */
interface Answer {
  text: string;
  tokens: string[];
  logprobs: number[];
}

async function complete(rt: Runtime, body: Body): Promise<Answer> {
  const res = await createGenerateApp(rt).request(
    "/v1/completions",
    post({ model: "fast", max_tokens: 12, logprobs: 2, ...body }),
  );
  assert.equal(res.status, 200, await res.clone().text());
  const c = (await res.json()).choices[0];
  return { text: c.text, tokens: c.logprobs.tokens, logprobs: c.logprobs.token_logprobs };
}

/** Same text and tokens, bit for bit. The logprobs agree to float summation order: a hit
 *  prefills only the tail, in a step of other shapes than the whole prompt's (the native tests
 *  show an adopted prefix is bit-exact against the same steps without sharing). */
function assertSameAnswer(got: Answer, want: Answer, what: string): void {
  assert.equal(got.text, want.text, what);
  assert.deepEqual(got.tokens, want.tokens, what);
  got.logprobs.forEach((lp, i) => {
    assert.ok(
      Math.abs(lp - want.logprobs[i]) < 1e-4,
      `${what}: logprob ${i} ${lp} vs ${want.logprobs[i]}`,
    );
  });
}

async function metric(rt: Runtime, name: string): Promise<number> {
  const text = await (await createGenerateApp(rt).request("/metrics")).text();
  return metricValue(text, `${name}{tier="fast"}`) || 0;
}

Deno.test("a prefix-cache hit adopts the pool's blocks: answers equal a server without the cache, greedy and seeded, with no KV byte copied", async () => {
  const rt = await testRuntime();
  const plain = await testRuntime({ config: { prefix_cache: { enabled: false } } });
  try {
    const cache = rt.tiers.get("fast")!.batch!.cache;
    const first = { prompt: [...prefix, ...tailA], temperature: 0 };
    assertSameAnswer(await complete(rt, first), await complete(plain, first), "first");
    assert.equal(cache.blocks, Math.floor(307 / 16), "the prompt's full blocks are cached");
    // 305 tokens: the first request with tail B adopts the 18 full blocks of the shared 300-token
    // prefix; the second, the same prompt again, also the 19th (which holds part of tail B).
    const sampled = [{ temperature: 0, shared: 18 }, { temperature: 1, seed: 7, shared: 19 }];
    for (const { shared, ...sampling } of sampled) {
      const shared0 = await metric(rt, "kvrelay_prefix_cache_shared_blocks_total");
      const body = { prompt: [...prefix, ...tailB], ...sampling };
      const got = await complete(rt, body);
      assertSameAnswer(got, await complete(plain, body), JSON.stringify(sampling));
      assert.equal(
        (await metric(rt, "kvrelay_prefix_cache_shared_blocks_total")) - shared0,
        shared,
      );
    }
    assert.equal(await metric(rt, "kvrelay_prefix_cache_copied_bytes_total"), 0);
    assert.ok(await metric(rt, "kvrelay_prefix_cache_hits_total") >= 2);
  } finally {
    await rt.close();
    await plain.close();
  }
});

Deno.test("another tenant (cache_salt) reuses none of a prefix another tenant left in the pool", async () => {
  const rt = await testRuntime();
  const plain = await testRuntime({ config: { prefix_cache: { enabled: false } } });
  try {
    const body = { prompt: [...prefix, ...tailA], temperature: 0 };
    await complete(rt, { ...body, cache_salt: "tenant-a" });
    const cached = rt.tiers.get("fast")!.batch!.cache.blocks;
    assert.ok(cached > 0);
    const other = { prompt: [...prefix, ...tailB], temperature: 0, cache_salt: "tenant-b" };
    assertSameAnswer(await complete(rt, other), await complete(plain, other), "tenant b");
    assert.equal(await metric(rt, "kvrelay_prefix_cache_shared_blocks_total"), 0);
    assert.equal(await metric(rt, "kvrelay_prefix_cache_hits_total"), 0);
    // Tenant b's own prefix went into the cache beside tenant a's.
    assert.equal(rt.tiers.get("fast")!.batch!.cache.blocks, cached + Math.floor(305 / 16));
    // The same tenant hits.
    await complete(rt, { ...other, cache_salt: "tenant-a" });
    assert.equal(await metric(rt, "kvrelay_prefix_cache_shared_blocks_total"), 18);
  } finally {
    await rt.close();
    await plain.close();
  }
});

Deno.test("pool pressure evicts cached blocks no request uses instead of refusing or waiting", async () => {
  const rt = await testRuntime({ tier: { kv_pool_mb: 1 } }); // 32 blocks of 16 tokens
  const plain = await testRuntime({ config: { prefix_cache: { enabled: false } } });
  try {
    const batch = rt.tiers.get("fast")!.batch!;
    assert.equal(batch.pool.blocksTotal, 32);
    await complete(rt, { prompt: [...prefix, ...tailA], temperature: 0 });
    assert.equal(batch.cache.blocks, 19);
    assert.equal(batch.pool.blocksFree, 13);
    // Another 307-token prompt needs 20 blocks: only evicting cached ones makes room.
    const other = { prompt: [...prefix.map((t) => t + 1), ...tailA], temperature: 0 };
    assertSameAnswer(await complete(rt, other), await complete(plain, other), "after eviction");
    assert.ok(batch.cache.stats.evicted >= 7, `evicted ${batch.cache.stats.evicted}`);
    assert.equal(batch.pool.blocksFree + batch.cache.blocks, 32, "every block is free or cached");
    const held = batch.cache.blocks;
    assert.equal(batch.cache.clear(), held);
    assert.equal(batch.pool.blocksFree, 32);
  } finally {
    await rt.close();
    await plain.close();
  }
});

Deno.test("a snapshot import evicts cached blocks no request uses, as a prompt does", async () => {
  const rt = await testRuntime({ tier: { kv_pool_mb: 1 } }); // 32 blocks of 16 tokens
  try {
    const batch = rt.tiers.get("fast")!.batch!;
    const model = rt.tiers.get("fast")!.model;
    const other = prefix.map((t) => t + 2);
    const res = await createPrefillApp(rt).request(
      "/v1/prefill",
      post({ tier: "fast", tokens: other }),
    );
    assert.equal(res.status, 200, await res.clone().text());
    const snap = new Uint8Array(await res.arrayBuffer());
    await complete(rt, { prompt: [...prefix, ...tailA], temperature: 0 });
    assert.equal(batch.cache.blocks, 19);
    assert.ok(batch.pool.blocksFree < 19, `free ${batch.pool.blocksFree}`);
    // The 300-token import needs 19 blocks: only evicting cached ones makes room (the import
    // writes outside the steps, so its reservation must free them, not just count them).
    const decoded = await createDecodeApp(rt).request(
      "/v1/decode?tier=fast&max_tokens=6&temperature=0",
      {
        method: "POST",
        headers: { "content-type": "application/vnd.kvrelay.snapshot" },
        body: snap,
      },
    );
    assert.equal(decoded.status, 200, await decoded.clone().text());
    const expected = await generate(model, other, { maxTokens: 6, temperature: 0 });
    assert.equal((await decoded.json()).text, expected.text);
    assert.ok(batch.cache.stats.evicted >= 6, `evicted ${batch.cache.stats.evicted}`);
  } finally {
    await rt.close();
  }
});
