// Tests of the pre-listen checks: the KV pool size arithmetic against the native pool's own block
// size (the oracle), kv_pool_mb derived when absent (and admitting concurrency × max_context),
// a too-small pool, a missing model folder and a projector joining the wrong tiers refused with
// the field, the value and the value that works.

import assert from "node:assert/strict";
import { parseConfig } from "../config/mod.ts";
import { NativeModel } from "../native/mod.ts";
import { checkpoint } from "../native/test_helpers.ts";
import { Metrics } from "./metrics.ts";
import { createBatching } from "./batching.ts";
import { derivedKvPoolMb, kvBlockBytes, minKvPoolMb, preflightProblems } from "./preflight.ts";

const root = new URL("../../", import.meta.url).pathname;
const powerful = `${root}models/tiny-powerful`;

function config(
  tiers: Record<string, Record<string, unknown>>,
  extra: Record<string, unknown> = {},
) {
  return parseConfig({ tiers, ...extra }, { env: () => undefined });
}

Deno.test("kvBlockBytes() agrees with the native pool's block size for each kv dtype", async () => {
  for (const kvDtype of ["f32", "bf16"] as const) {
    const model = await NativeModel.load(await checkpoint(powerful), { kvDtype, threads: 1 });
    try {
      const pool = model.createKvPool(2, 32);
      try {
        assert.equal(kvBlockBytes(model.config, kvDtype, 32), pool.blockBytes);
      } finally {
        pool.free();
      }
    } finally {
      model.free();
    }
  }
});

Deno.test("preflightProblems() derives kv_pool_mb when absent, and the pool then admits concurrency × max_context", async () => {
  const cfg = config({ p: { model: powerful, max_context: 1024, concurrency: 3, threads: 1 } });
  assert.equal(cfg.tiers.p.kv_pool_mb, undefined);
  assert.deepEqual(await preflightProblems(cfg), []);
  const tc = cfg.tiers.p;
  // tiny-powerful: 8 layers × 2 kv heads × 64 dims × K,V × f32 = 8 KiB a token.
  assert.equal(tc.kv_pool_mb, Math.ceil((3 * 1024 * 8192) / 2 ** 20));
  const model = await NativeModel.load(await checkpoint(powerful), { threads: 1 });
  try {
    const batch = createBatching("p", tc, model, new Metrics());
    try {
      assert.ok(batch.pool.blocksTotal >= 3 * (1024 / tc.kv_block_tokens));
    } finally {
      batch.pool.free();
    }
  } finally {
    model.free();
  }
});

Deno.test("preflightProblems() refuses a pool too small for max_context, naming the size that works", async () => {
  const cfg = config({ p: { model: powerful, kv_pool_mb: 4, max_context: 2048 } });
  const problems = await preflightProblems(cfg);
  assert.equal(problems.length, 1);
  // One 2048-token sequence: 2048 × 8 KiB = 16 MiB.
  assert.match(problems[0], /^tiers\.p\.kv_pool_mb: 4 holds 32 blocks .* at least 16\b/);
  assert.equal(minKvPoolMb(await readGeometry(), cfg.tiers.p), 16);
  assert.deepEqual(await preflightProblems(config({ p: { model: powerful, kv_pool_mb: 16 } })), []);
});

Deno.test("preflightProblems() refuses a missing model folder and a folder without a checkpoint", async () => {
  const empty = await Deno.makeTempDir({ prefix: "kvrelay-preflight-" });
  try {
    const cfg = config({ a: { model: "/nonexistent/qwen3" }, b: { model: empty } });
    const problems = await preflightProblems(cfg);
    assert.equal(problems.length, 2, problems.join("\n"));
    assert.match(problems[0], /^tiers\.a\.model: "\/nonexistent\/qwen3" does not exist/);
    assert.match(problems[1], /^tiers\.b\.model: ".*": .*config\.json/);
  } finally {
    await Deno.remove(empty, { recursive: true });
  }
});

Deno.test("preflightProblems() refuses a projector whose pair is not the tiers it joins", async () => {
  const cfg = config({
    fast: { model: `${root}models/tiny-fast` },
    powerful: { model: powerful },
  }, {
    projectors: [
      // The artifact maps tiny-fast → tiny-powerful; configured the other way round.
      { from: "powerful", to: "fast", path: `${root}models/projectors/tiny-fast--tiny-powerful` },
    ],
  });
  const problems = await preflightProblems(cfg);
  assert.equal(problems.length, 2, problems.join("\n"));
  assert.match(
    problems[0],
    /^projectors\.0\.from: tier "powerful" cannot be .*source \(tiny-fast\)/,
  );
  assert.match(problems[1], /^projectors\.0\.to: tier "fast" cannot be .*target \(tiny-powerful\)/);
  const ok = config({ fast: { model: `${root}models/tiny-fast` }, powerful: { model: powerful } }, {
    projectors: [{
      from: "fast",
      to: "powerful",
      path: `${root}models/projectors/tiny-fast--tiny-powerful`,
    }],
  });
  assert.deepEqual(await preflightProblems(ok), []);
});

async function readGeometry() {
  const c = JSON.parse(await Deno.readTextFile(`${powerful}/config.json`));
  return { numLayers: c.num_hidden_layers, numKvHeads: c.num_key_value_heads, headDim: c.head_dim };
}

// derivedKvPoolMb is the default the README documents: keep it tied to concurrency.
Deno.test("derivedKvPoolMb() grows with concurrency and max_context", async () => {
  const g = await readGeometry();
  const tc =
    config({ p: { model: powerful, max_context: 512, max_new_tokens: 256, concurrency: 1 } })
      .tiers.p;
  assert.equal(derivedKvPoolMb(g, tc), 4);
  assert.equal(derivedKvPoolMb(g, { ...tc, concurrency: 4 }), 16);
  assert.equal(derivedKvPoolMb(g, { ...tc, max_context: 1024 }), 8);
});
