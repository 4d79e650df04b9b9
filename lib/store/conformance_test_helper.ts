// Shared contract tests every SnapshotStore must pass (registered per store by its _test.ts).
// Expected values come from the test's own inputs (known answers), never from the store.
// Not a test file itself (no `_test.ts` suffix): import it and call `storeConformanceTests`.

import assert from "node:assert/strict";
import { type SnapshotStore, StoreError } from "./store.ts";

/** Deterministic bytes: value i of `n` bytes, byte j = (i * 31 + j * 7) & 255. */
export function pattern(i: number, n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let j = 0; j < n; j++) out[j] = (i * 31 + j * 7) & 255;
  return out;
}

/**
 * Registers the shared contract tests.
 * @param label the store's name in test names, e.g. "MemoryStore"
 * @param make opens a fresh, empty store; `cleanup` runs after close
 * @param ignore when set, every test is registered as ignored with this name suffix
 */
export function storeConformanceTests(
  label: string,
  make: () => Promise<{ store: SnapshotStore; cleanup?: () => Promise<void> }>,
  ignore?: string,
): void {
  const t = (name: string, fn: (s: SnapshotStore) => Promise<void>) =>
    Deno.test({
      name: `${label} ${name}${ignore ? ` (${ignore})` : ""}`,
      ignore: ignore !== undefined,
      fn: async () => {
        const { store, cleanup } = await make();
        try {
          await fn(store);
        } finally {
          await store.close();
          await cleanup?.();
        }
      },
    });

  t("`put()`/`get()` round-trips binary values of 0, 1 and 100000 bytes", async (s) => {
    const all = new Uint8Array(256).map((_, i) => i);
    await s.put("empty", new Uint8Array(0));
    await s.put("one", new Uint8Array([0]));
    await s.put("all", all);
    await s.put("big", pattern(7, 100_000));
    assert.deepEqual(await s.get("empty"), new Uint8Array(0));
    assert.deepEqual(await s.get("one"), new Uint8Array([0]));
    assert.deepEqual(await s.get("all"), all);
    assert.deepEqual(await s.get("big"), pattern(7, 100_000));
  });

  t("`get()` returns null and `has()`/`delete()` false when the key is absent", async (s) => {
    assert.equal(await s.get("nope"), null);
    assert.equal(await s.has("nope"), false);
    assert.equal(await s.delete("nope"), false);
  });

  t("`put()` replaces and `delete()` removes when the key exists", async (s) => {
    await s.put("k", new Uint8Array([1, 2, 3]));
    await s.put("k", new Uint8Array([9]));
    assert.deepEqual(await s.get("k"), new Uint8Array([9]));
    assert.equal(await s.has("k"), true);
    assert.equal(await s.delete("k"), true);
    assert.equal(await s.has("k"), false);
    assert.equal(await s.get("k"), null);
    assert.equal(await s.delete("k"), false);
  });

  t("`get()` returns bytes the caller owns when either side mutates its buffer", async (s) => {
    const v = new Uint8Array([1, 2, 3]);
    await s.put("k", v);
    v[0] = 99;
    const got = await s.get("k");
    assert.deepEqual(got, new Uint8Array([1, 2, 3]));
    got![1] = 77;
    assert.deepEqual(await s.get("k"), new Uint8Array([1, 2, 3]));
  });

  t("`put()`/`get()` reject bad keys and values with RangeError/TypeError", async (s) => {
    for (const k of ["", "a/b", "../x", ".hidden", "sp ace", "ü", "x".repeat(201)]) {
      await assert.rejects(s.put(k, new Uint8Array(1)), RangeError, `key ${JSON.stringify(k)}`);
      await assert.rejects(s.get(k), RangeError);
    }
    // deno-lint-ignore no-explicit-any
    await assert.rejects(s.put("k", [1, 2] as any), TypeError);
    // deno-lint-ignore no-explicit-any
    await assert.rejects(s.get(42 as any), TypeError);
    for (const ttl of [0, -5, 1.5, NaN, 2 ** 31]) {
      await assert.rejects(s.put("k", new Uint8Array(1), { ttlMs: ttl }), RangeError);
    }
    await s.put("x".repeat(200), new Uint8Array([5])); // longest legal key
    await s.put("a.B-9_c:d", new Uint8Array([6]));
    assert.deepEqual(await s.get("x".repeat(200)), new Uint8Array([5]));
    assert.deepEqual(await s.get("a.B-9_c:d"), new Uint8Array([6]));
  });

  t("concurrent `put()`/`get()` of 200 keys each return their own value", async (s) => {
    const n = 200;
    await Promise.all(Array.from({ length: n }, (_, i) => s.put(`c${i}`, pattern(i, 1000 + i))));
    const got = await Promise.all(Array.from({ length: n }, (_, i) => s.get(`c${i}`)));
    got.forEach((g, i) => assert.deepEqual(g, pattern(i, 1000 + i), `key c${i}`));
    // mixed readers and writers on the same keys: a reader sees an old or new whole value
    const ops: Promise<unknown>[] = [];
    for (let i = 0; i < n; i++) {
      ops.push(s.put(`c${i % 20}`, pattern(1000 + i, 2000)));
      ops.push(
        s.get(`c${i % 20}`).then((g) => {
          assert.ok(g !== null, `c${i % 20} vanished`);
          const ok = g.byteLength === 1000 + (i % 20) ||
            (g.byteLength === 2000 &&
              Array.from({ length: n }, (_, j) => j).some((j) =>
                j % 20 === i % 20 && g[1] === pattern(1000 + j, 2000)[1] &&
                g[1999] === pattern(1000 + j, 2000)[1999]
              ));
          assert.ok(ok, `c${i % 20} read a value no writer wrote (${g.byteLength} bytes)`);
        }),
      );
    }
    await Promise.all(ops);
  });

  t("methods reject with StoreError unavailable after `close()`", async (s) => {
    await s.close();
    await s.close(); // twice is fine
    for (const p of [s.put("k", new Uint8Array(1)), s.get("k"), s.has("k"), s.delete("k")]) {
      await assert.rejects(p, (e) => e instanceof StoreError && e.kind === "unavailable");
    }
  });
}
