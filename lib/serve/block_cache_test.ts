// Tests of BlockCache (the prefix cache inside a KV pool) on a real pool: block counts when many
// sequences share one prefix (exact, from the pool), keys bound to the seed (model and tenant),
// leases keeping entries from eviction, and eviction least recently used first.

import assert from "node:assert/strict";
import { NativeModel } from "../native/mod.ts";
import { checkpoint, DEMO_DIRS, tokens } from "../native/test_helpers.ts";
import { BlockCache } from "./block_cache.ts";

const seedA = new Uint8Array(32).fill(1), seedB = new Uint8Array(32).fill(2);

Deno.test("BlockCache: 64 sequences sharing a 1,024-token prefix hold the prefix's blocks once plus their tails", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const vocab = model.config.vocabSize;
  const pool = model.createKvPool(256, 16);
  const cache = new BlockCache(pool);
  const prefix = tokens(1024, vocab, 1);
  const seqs = [];
  for (let i = 0; i < 64; i++) {
    const prompt = [...prefix, ...tokens(8, vocab, 100 + i)];
    const keys = await cache.keys(seedA, prompt, Math.floor(prompt.length / 16));
    const seq = pool.createSequence(2048);
    const lease = cache.adopt(seq, keys.slice(0, Math.floor((prompt.length - 1) / 16)));
    assert.equal(lease.reusedTokens, i === 0 ? 0 : 1024, `sequence ${i}`);
    await seq.prefill(prompt.slice(lease.reusedTokens));
    cache.insert(seq, keys, lease);
    seqs.push(seq);
  }
  const prefixBlocks = 1024 / 16, tailBlocks = 64; // each 8-token tail: one block of its own
  const used = pool.blocksTotal - pool.blocksFree;
  assert.equal(used, prefixBlocks + tailBlocks);
  assert.ok(used <= 1.2 * (prefixBlocks + tailBlocks));
  assert.equal(cache.blocks, prefixBlocks);
  assert.equal(cache.stats.sharedBlocks, 63 * prefixBlocks);
  for (const s of seqs) s.free();
  assert.equal(
    pool.blocksFree,
    pool.blocksTotal - prefixBlocks,
    "the cache still holds the prefix",
  );
  pool.free();
});

Deno.test("BlockCache: keys chain over the seed, so another seed (tenant or model) finds nothing", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const pool = model.createKvPool(16, 16);
  const cache = new BlockCache(pool);
  const prompt = tokens(40, model.config.vocabSize, 2);
  const a = await cache.keys(seedA, prompt, 2), b = await cache.keys(seedB, prompt, 2);
  assert.equal(a.length, 2);
  assert.ok(a.every((k) => !b.includes(k)));
  // A chain: the second key depends on the first block's tokens too.
  const other = [...prompt];
  other[0] ^= 1;
  const c = await cache.keys(seedA, other, 2);
  assert.notEqual(c[1], a[1]);
  assert.deepEqual(await cache.keys(seedA, prompt, 2), a);
  const seq = pool.createSequence(64);
  await seq.prefill(prompt);
  cache.insert(seq, a, { reusedTokens: 0, entries: [] });
  const probe = pool.createSequence(64);
  assert.equal(cache.adopt(probe, b).reusedTokens, 0);
  assert.equal(probe.length, 0);
  assert.equal(cache.adopt(probe, a).reusedTokens, 32);
  probe.free();
  seq.free();
  pool.free();
});

Deno.test("BlockCache: a leased entry is never evicted; idle ones go least recently used first and free their blocks", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const pool = model.createKvPool(16, 16);
  const cache = new BlockCache(pool);
  const vocab = model.config.vocabSize;
  const p1 = tokens(32, vocab, 3), p2 = tokens(32, vocab, 4);
  const k1 = await cache.keys(seedA, p1, 2), k2 = await cache.keys(seedA, p2, 2);
  const s1 = pool.createSequence(64), s2 = pool.createSequence(64);
  await s1.prefill(p1);
  await s2.prefill(p2);
  const l1 = cache.insert(s1, k1, { reusedTokens: 0, entries: [] });
  const l2 = cache.insert(s2, k2, { reusedTokens: 0, entries: [] });
  assert.equal(cache.blocks, 4);
  assert.equal(cache.evictable, 0);
  assert.equal(cache.evict(4), 0, "every entry is in use");
  s1.free();
  cache.release(l1);
  s2.free();
  cache.release(l2);
  assert.equal(cache.evictable, 4);
  assert.equal(pool.blocksFree, 12, "idle cached blocks stay held");
  // p1 used again (and released): p2's blocks are now the least recently used.
  const s3 = pool.createSequence(64);
  const l3 = cache.adopt(s3, k1);
  assert.equal(l3.reusedTokens, 32);
  s3.free();
  cache.release(l3);
  assert.equal(cache.evict(2), 2);
  const probe = pool.createSequence(64);
  assert.equal(cache.adopt(probe, k2).reusedTokens, 0, "p2 went first");
  const l4 = cache.adopt(probe, k1);
  assert.equal(l4.reusedTokens, 32);
  assert.equal(pool.blocksFree, 14);
  probe.free();
  cache.release(l4);
  assert.equal(cache.clear(), 2);
  assert.equal(pool.blocksFree, 16);
  pool.free();
});
