// Tests of MemoryStore: the shared contract, LRU-by-bytes eviction order, TTL with an injected
// clock (no sleeping), sweep and counters. Expected orders are worked out by hand in comments.

import assert from "node:assert/strict";
import { MemoryStore } from "./memory_store.ts";
import { StoreError } from "./store.ts";
import { pattern, storeConformanceTests } from "./conformance_test_helper.ts";

storeConformanceTests("MemoryStore", () => Promise.resolve({ store: new MemoryStore() }));

Deno.test("`MemoryStore.put()` evicts least-recently-used first when over the byte budget", async () => {
  const s = new MemoryStore({ maxBytes: 100 });
  try {
    await s.put("a", pattern(1, 40));
    await s.put("b", pattern(2, 40)); // order a, b (80 B)
    assert.ok(await s.get("a")); // order b, a
    await s.put("c", pattern(3, 40)); // 120 > 100: evict b → a, c (80 B)
    assert.equal(await s.has("b"), false);
    assert.deepEqual(await s.get("a"), pattern(1, 40)); // order c, a
    await s.put("d", pattern(4, 60)); // 140 > 100: evict c (100 B fits) → a, d
    assert.equal(await s.has("c"), false);
    assert.equal(await s.has("a"), true);
    assert.equal(await s.has("d"), true);
    await s.put("e", pattern(5, 100)); // evict a then d → e alone
    assert.deepEqual(
      [await s.has("a"), await s.has("d"), await s.has("e")],
      [false, false, true],
    );
    const st = s.stats();
    assert.equal(st.bytes, 100);
    assert.equal(st.entries, 1);
    assert.equal(st.evictions, 4); // b, c, a, d
  } finally {
    await s.close();
  }
});

Deno.test("`MemoryStore.put()` throws StoreError too_large when one value exceeds the budget", async () => {
  const s = new MemoryStore({ maxBytes: 10 });
  try {
    await s.put("small", new Uint8Array(10));
    await assert.rejects(
      s.put("big", new Uint8Array(11)),
      (e) => e instanceof StoreError && e.kind === "too_large" && /11 bytes/.test(e.message),
    );
    assert.deepEqual(await s.get("small"), new Uint8Array(10)); // untouched
  } finally {
    await s.close();
  }
});

Deno.test("`MemoryStore.get()` returns null once the TTL passes on the injected clock", async () => {
  let now = 1_000;
  const s = new MemoryStore({ now: () => now, defaultTtlMs: 500, sweepIntervalMs: 0 });
  try {
    await s.put("short", new Uint8Array([1]), { ttlMs: 100 });
    await s.put("dflt", new Uint8Array([2])); // default 500 ms
    now = 1_099;
    assert.deepEqual(await s.get("short"), new Uint8Array([1]));
    now = 1_100; // expiresAt = 1100: expired at exactly that time
    assert.equal(await s.get("short"), null);
    assert.equal(await s.has("dflt"), true);
    now = 1_500;
    assert.equal(await s.has("dflt"), false);
    assert.equal(await s.delete("dflt"), false); // expired entries are not "deleted"
    assert.equal(s.stats().expirations, 2);
    assert.equal(s.stats().bytes, 0);
  } finally {
    await s.close();
  }
});

Deno.test("`MemoryStore.sweep()` removes only expired entries and they go before live ones", async () => {
  let now = 0;
  const s = new MemoryStore({ now: () => now, maxBytes: 30, sweepIntervalMs: 0 });
  try {
    await s.put("old-live", new Uint8Array(10));
    await s.put("ttl", new Uint8Array(10), { ttlMs: 5 });
    await s.put("live", new Uint8Array(10));
    now = 10;
    // over budget with a 10-byte put: the expired "ttl" goes, not the LRU "old-live"
    await s.put("new", new Uint8Array(10));
    assert.equal(await s.has("old-live"), true);
    assert.equal(s.stats().evictions, 0);
    assert.equal(s.stats().expirations, 1);
    await s.delete("new"); // 20 B live: old-live, live
    await s.put("t2", new Uint8Array(1), { ttlMs: 1 }); // 21 B, no eviction
    now = 11;
    assert.equal(s.sweep(), 1);
    assert.equal(s.stats().entries, 2);
    assert.equal(s.stats().bytes, 20);
  } finally {
    await s.close();
  }
});

Deno.test("`MemoryStore` counts hits, misses and puts when used", async () => {
  const s = new MemoryStore();
  try {
    await s.put("a", new Uint8Array(3));
    await s.get("a");
    await s.get("a");
    await s.get("b");
    assert.deepEqual(s.stats(), {
      entries: 1,
      bytes: 3,
      hits: 2,
      misses: 1,
      puts: 1,
      evictions: 0,
      expirations: 0,
    });
  } finally {
    await s.close();
  }
});

Deno.test("`new MemoryStore()` rejects bad options with RangeError/TypeError", () => {
  assert.throws(() => new MemoryStore({ maxBytes: 0 }), RangeError);
  assert.throws(() => new MemoryStore({ maxBytes: 1.5 }), RangeError);
  assert.throws(() => new MemoryStore({ defaultTtlMs: -1 }), RangeError);
  assert.throws(() => new MemoryStore({ sweepIntervalMs: -1 }), RangeError);
  // deno-lint-ignore no-explicit-any
  assert.throws(() => new MemoryStore({ now: 5 as any }), TypeError);
});
