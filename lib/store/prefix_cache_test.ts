// Tests of the prefix cache on a real demo model with a MemoryStore: a second request sharing a
// 1000-token prefix prefills only its new tokens (counters) and yields the same logits as a full
// prefill; keys follow the documented chained SHA-256 (recomputed here independently); tenants
// and poisoned entries are isolated.

import assert from "node:assert/strict";
import { type LoadedModel, loadModel } from "../engine/mod.ts";
import { MemoryStore } from "./memory_store.ts";
import { prefillWithCache, PrefixCache } from "./prefix_cache.ts";

const MODELS = new URL("../../models/", import.meta.url).pathname;
import { VALID_SAMPLE_PATH as CORPUS } from "../../tests/support/corpus.ts";

async function corpusIds(model: LoadedModel, n: number, at: number): Promise<number[]> {
  const ids = model.tokenizer.encode((await Deno.readTextFile(CORPUS)).slice(at, at + 8 * n));
  assert(ids.length >= n);
  return ids.slice(0, n);
}

async function fullPrefill(model: LoadedModel, tokens: number[]): Promise<Float32Array> {
  const seq = model.native.createSequence(tokens.length);
  try {
    return await seq.prefill(tokens);
  } finally {
    seq.free();
  }
}

Deno.test("`prefillWithCache()` reuses a shared 1000-token prefix: only new tokens prefilled, same logits", async () => {
  const model = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  const store = new MemoryStore();
  try {
    const cache = new PrefixCache({ store, model, tenantSalt: "tenant-a", chunkTokens: 100 });
    const prefix = await corpusIds(model, 1000, 0);
    const a = [...prefix, ...await corpusIds(model, 60, 20000)];
    const b = [...prefix, ...await corpusIds(model, 45, 40000)];
    const seqA = model.native.createSequence(a.length);
    const ra = await prefillWithCache(cache, seqA, a);
    assert.equal(ra.reusedTokens, 0);
    assert.equal(ra.prefilledTokens, a.length);
    assert.equal(cache.stats.stored, 10); // 1060 tokens: 10 full chunks
    assert.deepEqual(ra.logits, await fullPrefill(model, a));
    seqA.free();

    const seqB = model.native.createSequence(b.length);
    const rb = await prefillWithCache(cache, seqB, b);
    assert.equal(rb.reusedTokens, 1000);
    assert.equal(rb.prefilledTokens, 45, "only the new tokens are prefilled");
    assert.deepEqual(
      {
        hits: cache.stats.hits,
        misses: cache.stats.misses,
        prefilled: cache.stats.prefilledTokens,
      },
      { hits: 10, misses: 10, prefilled: 1060 + 45 },
    );
    const want = await fullPrefill(model, b);
    let maxDiff = 0;
    for (let i = 0; i < want.length; i++) {
      maxDiff = Math.max(maxDiff, Math.abs(want[i] - rb.logits[i]));
    }
    assert.equal(maxDiff, 0, `logits differ from a full prefill by up to ${maxDiff}`);
    // the restored sequence decodes on like a fully prefilled one
    assert.equal(seqB.length, b.length);
    seqB.free();

    // another tenant shares nothing
    const other = new PrefixCache({ store, model, tenantSalt: "tenant-b", chunkTokens: 100 });
    const seqC = model.native.createSequence(b.length);
    const rc = await prefillWithCache(other, seqC, b);
    assert.equal(rc.reusedTokens, 0);
    seqC.free();
  } finally {
    await store.close();
    model.native.free();
  }
});

Deno.test("`PrefixCache.chunkKeys()` chains SHA-256 over parent key and u32le token ids", async () => {
  const model = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  const store = new MemoryStore();
  try {
    const cache = new PrefixCache({ store, model, tenantSalt: "s", chunkTokens: 2 });
    const keys = await cache.chunkKeys([1, 2, 3, 4, 5]);
    assert.equal(keys.length, 2);
    // independent recomputation
    const enc = new TextEncoder();
    const fp = enc.encode(model.fingerprint);
    const u32 = (...xs: number[]) => new Uint8Array(new Uint32Array(xs).buffer);
    const cat = (...ps: Uint8Array[]) => {
      const out = new Uint8Array(ps.reduce((n, p) => n + p.length, 0));
      let o = 0;
      for (const p of ps) (out.set(p, o), o += p.length);
      return out;
    };
    const h = async (b: Uint8Array) =>
      new Uint8Array(await crypto.subtle.digest("SHA-256", b as Uint8Array<ArrayBuffer>));
    const seed = await h(
      cat(enc.encode("kvrelay-prefix-cache-v1\0"), u32(fp.length), fp, u32(1), enc.encode("s")),
    );
    const k0 = await h(cat(seed, u32(1, 2)));
    const k1 = await h(cat(k0, u32(3, 4)));
    const hex = (b: Uint8Array) => [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
    assert.deepEqual(keys, [`pfx:${hex(k0)}`, `pfx:${hex(k1)}`]);
  } finally {
    await store.close();
    model.native.free();
  }
});

Deno.test("`prefillWithCache()` treats a corrupted or mismatched entry as a miss", async () => {
  const model = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  const store = new MemoryStore();
  try {
    const cache = new PrefixCache({ store, model, tenantSalt: "t", chunkTokens: 16 });
    const toks = await corpusIds(model, 50, 300);
    const s1 = model.native.createSequence(50);
    await prefillWithCache(cache, s1, toks);
    s1.free();
    const [k0, k1] = await cache.chunkKeys(toks);
    // chunk 1's entry replaced by chunk 0's bytes (other tokens) and chunk 0 corrupted
    const e0 = (await store.get(k0))!;
    await store.put(k1, e0);
    const bad = e0.slice();
    bad[bad.length - 10] ^= 1;
    await store.put(k0, bad);
    const s2 = model.native.createSequence(50);
    const r = await prefillWithCache(cache, s2, toks);
    assert.equal(r.reusedTokens, 0);
    assert.equal(cache.stats.rejected, 1);
    assert.deepEqual(r.logits, await fullPrefill(model, toks));
    s2.free();
  } finally {
    await store.close();
    model.native.free();
  }
});

Deno.test("`prefillWithCache()` with q8 chunks reuses the prefix with logits close to a full prefill", async () => {
  const model = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  const store = new MemoryStore();
  try {
    const cache = new PrefixCache({
      store,
      model,
      tenantSalt: "q",
      chunkTokens: 32,
      encoding: "q8",
    });
    const toks = await corpusIds(model, 100, 900);
    const s1 = model.native.createSequence(100);
    await prefillWithCache(cache, s1, toks);
    s1.free();
    const s2 = model.native.createSequence(100);
    const r = await prefillWithCache(cache, s2, toks);
    s2.free();
    assert.equal(r.reusedTokens, 96);
    assert.equal(cache.stats.hits, 3);
    const want = await fullPrefill(model, toks);
    let maxDiff = 0;
    for (let i = 0; i < want.length; i++) {
      maxDiff = Math.max(maxDiff, Math.abs(want[i] - r.logits[i]));
    }
    assert(maxDiff > 0 && maxDiff < 0.5, `q8 logits differ by ${maxDiff}`);
  } finally {
    await store.close();
    model.native.free();
  }
});
