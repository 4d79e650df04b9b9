// Tests of RedisStore against a real redis-server started per test on a free loopback port:
// the shared contract, PX expiry, namespacing (checked over raw RESP), server-side LRU budget,
// OOM, and availability: down → StoreError "unavailable" fast, hung → after the deadline, and
// recovery when the server returns. Skipped (with the install line) when redis-server is missing.

import assert from "node:assert/strict";
import { RedisStore, type RedisStoreOptions } from "./redis_store.ts";
import { StoreError } from "./store.ts";
import { pattern, storeConformanceTests } from "./conformance_test_helper.ts";
import { RedisServer, redisTestGate } from "../../tests/support/redis_server.ts";

const gate = redisTestGate();

storeConformanceTests(
  "RedisStore",
  async () => {
    const server = await RedisServer.start();
    try {
      const store = await RedisStore.connect({ url: server.url });
      return { store, cleanup: () => server.dispose() };
    } catch (e) {
      await server.dispose();
      throw e;
    }
  },
  gate.ignore ? gate.suffix.trim().slice(1, -1) : undefined,
);

/** Registers a test with its own server and store, both closed in `finally`. */
function redisTest(
  name: string,
  fn: (server: RedisServer, store: RedisStore) => Promise<void>,
  opts: { serverArgs?: string[]; store?: Omit<RedisStoreOptions, "url"> } = {},
): void {
  Deno.test({
    name: name + gate.suffix,
    ignore: gate.ignore,
    fn: async () => {
      const server = await RedisServer.start({ args: opts.serverArgs });
      let store: RedisStore | undefined;
      try {
        store = await RedisStore.connect({ url: server.url, ...opts.store });
        await fn(server, store);
      } finally {
        await store?.close();
        await server.dispose();
      }
    },
  });
}

const isUnavailable = (e: unknown) =>
  e instanceof StoreError && e.kind === "unavailable" && e.store === "redis";

/** Retries `fn` every 50 ms until it resolves or `ms` pass; returns its value and the wait. */
async function eventually<T>(ms: number, fn: () => Promise<T>): Promise<[T, number]> {
  const t0 = Date.now();
  for (;;) {
    try {
      return [await fn(), Date.now() - t0];
    } catch (e) {
      if (Date.now() - t0 > ms) throw e;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

redisTest("`RedisStore.get()` returns null after a 50 ms PX TTL passes", async (_server, s) => {
  const t0 = Date.now();
  await s.put("ttl", new Uint8Array([1, 2]), { ttlMs: 50 });
  await s.put("keep", new Uint8Array([3]));
  const first = await s.get("ttl");
  if (Date.now() - t0 < 45) assert.deepEqual(first, new Uint8Array([1, 2]));
  const [, waited] = await eventually(2000, async () => {
    assert.equal(await s.get("ttl"), null);
  });
  assert.ok(Date.now() - t0 >= 50, `expired after only ${Date.now() - t0} ms`);
  assert.ok(waited < 2000);
  assert.equal(await s.has("ttl"), false);
  assert.deepEqual(await s.get("keep"), new Uint8Array([3]));
});

redisTest("`RedisStore.put()` sets PX in the same SET when given ttlMs", async (server, s) => {
  await s.put("t", new Uint8Array([9]), { ttlMs: 100_000 });
  const pttl = Number((await server.command("PTTL", "kvrelay:t")).slice(1)); // ":<ms>\r\n"
  assert.ok(pttl > 90_000 && pttl <= 100_000, `PTTL ${pttl}`);
  await s.put("n", new Uint8Array([9]));
  assert.equal(await server.command("PTTL", "kvrelay:n"), ":-1\r\n"); // no expiry
});

redisTest(
  "`RedisStore` keys live under keyPrefix and prefixes do not see each other",
  async (server, s) => {
    const other = await RedisStore.connect({ url: server.url, keyPrefix: "tenantB:" });
    try {
      await s.put("same", new TextEncoder().encode("A"));
      await other.put("same", new TextEncoder().encode("B"));
      assert.equal(new TextDecoder().decode((await s.get("same"))!), "A");
      assert.equal(new TextDecoder().decode((await other.get("same"))!), "B");
      assert.equal(await server.command("GET", "kvrelay:same"), "$1\r\nA\r\n");
      assert.equal(await server.command("GET", "tenantB:same"), "$1\r\nB\r\n");
      assert.equal(await other.delete("same"), true);
      assert.equal(await s.has("same"), true);
    } finally {
      await other.close();
    }
  },
);

redisTest(
  "`RedisStore.put()` throws too_large before sending when over maxBytes",
  async (server, s) => {
    await assert.rejects(
      s.put("big", new Uint8Array(1025)),
      (e) => e instanceof StoreError && e.kind === "too_large" && /1025 bytes/.test(e.message),
    );
    assert.equal(await server.command("DBSIZE"), ":0\r\n");
  },
  { store: { maxBytes: 1024 } },
);

redisTest(
  "`RedisStore` keeps recent keys and evicts old ones when the server budget is full",
  async (server, s) => {
    const n = 96;
    const size = 64 * 1024; // 96 × 64 KiB = 6 MiB written into a 3 MiB server
    for (let i = 0; i < n; i++) await s.put(`k${i}`, pattern(i, size));
    const alive = [];
    for (let i = 0; i < n; i++) if (await s.has(`k${i}`)) alive.push(i);
    assert.ok(alive.length < n, "nothing was evicted");
    assert.ok(alive.length * size <= 3 * 1024 * 1024, `${alive.length} keys alive`);
    assert.deepEqual(await s.get(`k${n - 1}`), pattern(n - 1, size)); // newest survives
    const firstHalf = alive.filter((i) => i < n / 2).length;
    const secondHalf = alive.filter((i) => i >= n / 2).length;
    assert.ok(secondHalf > firstHalf, `approx LRU: ${firstHalf} old vs ${secondHalf} new alive`);
    const info = await server.command("CONFIG", "GET", "maxmemory-policy");
    assert.ok(info.includes("allkeys-lru"));
  },
  { serverArgs: ["--maxmemory", "3mb"], store: { applyServerBudget: 3 * 1024 * 1024 } },
);

redisTest(
  "`RedisStore.put()` throws too_large when a noeviction server is full",
  async (_server, s) => {
    let err: unknown;
    for (let i = 0; i < 64 && err === undefined; i++) {
      await s.put(`k${i}`, pattern(i, 256 * 1024)).catch((e) => (err = e));
    }
    assert.ok(
      err instanceof StoreError && err.kind === "too_large" && /OOM/.test(err.message),
      String(err),
    );
  },
  { serverArgs: ["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"] },
);

Deno.test({
  name: "`RedisStore` fails fast with unavailable when the server dies, then recovers" +
    gate.suffix,
  ignore: gate.ignore,
  fn: async () => {
    const server = await RedisServer.start();
    let s: RedisStore | undefined;
    try {
      s = await RedisStore.connect({ url: server.url, commandTimeoutMs: 1000 });
      await s.put("k", new Uint8Array([1, 2, 3]));
      await server.kill("SIGKILL");
      const t0 = performance.now();
      await assert.rejects(s.get("k"), (e) => isUnavailable(e) && /unavailable/.test(String(e)));
      await assert.rejects(s.put("k2", new Uint8Array([4])), isUnavailable);
      await assert.rejects(s.has("k"), isUnavailable);
      await assert.rejects(s.delete("k"), isUnavailable);
      const elapsed = performance.now() - t0;
      assert.ok(elapsed < 1000, `four calls took ${elapsed.toFixed(0)} ms while down`);
      await server.restart(); // same port, empty (no persistence)
      const [got, waited] = await eventually(5000, () => s!.get("k"));
      assert.equal(got, null); // the data died with the server
      assert.ok(waited < 5000);
      await s.put("k", new Uint8Array([7]));
      assert.deepEqual(await s.get("k"), new Uint8Array([7]));
    } finally {
      await s?.close();
      await server.dispose();
    }
  },
});

Deno.test({
  name: "`RedisStore` fails with unavailable after commandTimeoutMs when the server hangs" +
    gate.suffix,
  ignore: gate.ignore,
  fn: async () => {
    const server = await RedisServer.start();
    let s: RedisStore | undefined;
    try {
      s = await RedisStore.connect({ url: server.url, commandTimeoutMs: 300 });
      await s.put("k", new Uint8Array([5]));
      await server.pause();
      const t0 = performance.now();
      await assert.rejects(
        s.get("k"),
        (e) => isUnavailable(e) && /no reply within 300 ms/.test(String(e)),
      );
      const elapsed = performance.now() - t0;
      assert.ok(elapsed >= 250 && elapsed < 1500, `took ${elapsed.toFixed(0)} ms`);
      await server.resume();
      // replies to abandoned commands arrive in order; later calls get their own replies
      const [got] = await eventually(3000, () => s!.get("k"));
      assert.deepEqual(got, new Uint8Array([5]));
      await s.put("k", new Uint8Array([6]));
      assert.deepEqual(await s.get("k"), new Uint8Array([6]));
    } finally {
      await server.resume().catch(() => {});
      await s?.close();
      await server.dispose();
    }
  },
});

Deno.test({
  name: "`RedisStore.connect()` throws unavailable within the timeout when nothing listens" +
    gate.suffix,
  ignore: gate.ignore,
  fn: async () => {
    const server = await RedisServer.start(); // only to get a port we then free
    const port = server.port;
    await server.kill("SIGKILL");
    try {
      const t0 = performance.now();
      await assert.rejects(
        RedisStore.connect({ url: `redis://127.0.0.1:${port}`, connectTimeoutMs: 300 }),
        (e) => isUnavailable(e) && String(e).includes(`127.0.0.1:${port}`),
      );
      assert.ok(performance.now() - t0 < 1500);
      // a store built without waiting works once the server appears
      const s = new RedisStore({ url: `redis://127.0.0.1:${port}` });
      try {
        await assert.rejects(s.get("x"), isUnavailable);
        await server.restart();
        await eventually(5000, () => s.put("x", new Uint8Array([1])));
        assert.deepEqual(await s.get("x"), new Uint8Array([1]));
      } finally {
        await s.close();
      }
    } finally {
      await server.dispose();
    }
  },
});

Deno.test("`new RedisStore()` rejects bad options with TypeError/RangeError", async () => {
  assert.throws(() => new RedisStore({ url: "http://x" }), TypeError);
  assert.throws(() => new RedisStore({ url: "not a url" }), TypeError);
  assert.throws(() => new RedisStore({ keyPrefix: "a b" }), RangeError);
  assert.throws(() => new RedisStore({ maxBytes: 0 }), RangeError);
  assert.throws(() => new RedisStore({ maxBytes: 2 ** 30 }), RangeError);
  assert.throws(() => new RedisStore({ commandTimeoutMs: 0 }), RangeError);
  assert.throws(() => new RedisStore({ defaultTtlMs: 1.5 }), RangeError);
  await Promise.resolve();
});
