// Hostile-client tests of the HTTP layer via app.request(): tenant-isolated prefix cache, JSON
// routes refusing non-JSON content types (415) and CORS off unless configured, non-finite KV in
// snapshots refused, optional caches degrading when the store is down (and no address leaking),
// internal errors as generic 500s with a request id, real migration refusal reasons, invalid
// UTF-8 and lone surrogates (400), wrong methods (405 with Allow), oversized headers (431).
import assert from "node:assert/strict";
import { crc32c, decodeHeader } from "../../lib/snapshot/mod.ts";
import { MemoryStore, type SnapshotStore, StoreError } from "../../lib/store/mod.ts";
import { registerDecode } from "../decode/app.ts";
import { createGenerateApp, registerGenerate } from "../generate/app.ts";
import { registerMigrate } from "../migrate/app.ts";
import { createPrefillApp, registerPrefill } from "../prefill/app.ts";
import { createBaseApp } from "./app.ts";
import { post, testRuntime } from "./test_helpers.ts";
import { type Runtime, snapshotKey } from "../../lib/serve/mod.ts";

const SNAP = { "content-type": "application/vnd.kvrelay.snapshot" };
// Long enough for several 16-token prefix-cache chunks.
const prompt =
  "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity";

function allApp(rt: Runtime) {
  const app = createBaseApp(rt, "all");
  registerGenerate(app, rt);
  registerPrefill(app, rt);
  registerDecode(app, rt);
  registerMigrate(app, rt);
  return app;
}

async function snapshotOf(rt: Runtime, tier = "fast"): Promise<Uint8Array<ArrayBuffer>> {
  const res = await createPrefillApp(rt).request("/v1/prefill", post({ tier, prompt }));
  assert.equal(res.status, 200);
  return new Uint8Array(await res.arrayBuffer());
}

Deno.test("the prefix cache is per tenant: reuse is reported only within one API key's tenant or cache_salt", async () => {
  const rt = await testRuntime({ env: { KVRELAY_API_KEYS: "alice:key-a,bob:key-b,key-c" } });
  try {
    const app = createGenerateApp(rt);
    const ask = async (key: string, extra: Record<string, unknown> = {}) => {
      const res = await app.request(
        "/v1/completions",
        post({ model: "fast", prompt, max_tokens: 1, ...extra }, {
          authorization: `Bearer ${key}`,
        }),
      );
      assert.equal(res.status, 200);
      return (await res.json()).kvrelay.cache.reused_tokens as number;
    };
    assert.equal(await ask("key-a"), 0);
    assert.ok(await ask("key-a") > 0, "alice reuses her own prefix");
    assert.equal(await ask("key-b"), 0, "bob cannot see alice's prefix");
    assert.equal(await ask("key-c"), 0, "a bare key is its own tenant");
    assert.equal(await ask("key-a", { cache_salt: "s1" }), 0, "a cache_salt isolates further");
    assert.ok(await ask("key-a", { cache_salt: "s1" }) > 0);
  } finally {
    await rt.close();
  }
});

Deno.test("without a configured salt each process keys the cache with its own random secret", async () => {
  const store = new MemoryStore({ maxBytes: 64 << 20 });
  const shared = { close: () => Promise.resolve() };
  const view = new Proxy(store, {
    get: (
      t,
      k,
    ) => (k === "close" ? shared.close : Reflect.get(t, k).bind?.(t) ?? Reflect.get(t, k)),
  }) as SnapshotStore;
  const reused = async (env: Record<string, string>) => {
    const rt = await testRuntime({ env, store: view });
    try {
      const res = await createGenerateApp(rt).request(
        "/v1/completions",
        post({ model: "fast", prompt, max_tokens: 1 }),
      );
      return (await res.json()).kvrelay.cache.reused_tokens as number;
    } finally {
      await rt.close();
    }
  };
  try {
    assert.equal(await reused({}), 0);
    assert.equal(await reused({}), 0, "a second process cannot hit the first one's entries");
    const salted = { KVRELAY_TENANT_SALT: "deployment-secret" };
    assert.equal(await reused(salted), 0);
    assert.ok(await reused(salted) > 0, "processes sharing a configured salt share entries");
  } finally {
    await store.close();
  }
});

Deno.test("JSON routes answer 415 to non-JSON content types; CORS headers only when configured", async () => {
  const rt = await testRuntime();
  try {
    const app = allApp(rt);
    const body = JSON.stringify({ model: "fast", prompt: "hi", max_tokens: 1 });
    for (const url of ["/v1/completions", "/v1/chat/completions", "/v1/generate", "/v1/prefill"]) {
      for (
        const type of [
          "text/plain",
          "application/x-www-form-urlencoded",
          "multipart/form-data; boundary=x",
        ]
      ) {
        const res = await app.request(url, {
          method: "POST",
          headers: { "content-type": type },
          body,
        });
        assert.equal(res.status, 415, `${url} ${type}`);
        assert.equal((await res.json()).error.param, "content-type");
      }
    }
    for (const url of ["/v1/decode", "/v1/migrate"]) {
      const res = await app.request(url, {
        method: "POST",
        headers: { "content-type": "text/plain" },
        body: '{"snapshot_id": "x", "target": "fast"}',
      });
      assert.equal(res.status, 415, url);
    }
    const cross = await app.request("/v1/completions", {
      method: "OPTIONS",
      headers: { origin: "https://evil.example", "access-control-request-method": "POST" },
    });
    assert.equal(cross.headers.get("access-control-allow-origin"), null);
  } finally {
    await rt.close();
  }
  const withCors = await testRuntime({
    config: {
      server: {
        max_body_bytes: 8192,
        max_snapshot_bytes: 1 << 20,
        cors_origins: ["https://app.example"],
      },
    },
  });
  try {
    const app = allApp(withCors);
    const pre = await app.request("/v1/completions", {
      method: "OPTIONS",
      headers: { origin: "https://app.example", "access-control-request-method": "POST" },
    });
    assert.equal(pre.headers.get("access-control-allow-origin"), "https://app.example");
    const other = await app.request("/healthz", { headers: { origin: "https://evil.example" } });
    assert.notEqual(other.headers.get("access-control-allow-origin"), "https://evil.example");
  } finally {
    await withCors.close();
  }
});

/** A copy of `snap` with element `at` of chunk 0's payload (f32) set to `value`, CRC fixed. */
function poison(snap: Uint8Array, value: number, at = 5): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(snap);
  const { header, layout } = decodeHeader(out);
  assert.equal(header.encoding, "f32");
  const start = layout.payloadStart + header.chunks[0].offset;
  const frame = out.subarray(start, start + header.chunks[0].length);
  const dv = new DataView(frame.buffer, frame.byteOffset, frame.byteLength);
  dv.setFloat32(8 + 4 * at, value, true);
  const end = frame.length - 4;
  dv.setUint32(end, crc32c(frame.subarray(0, end)), true);
  return out;
}

Deno.test("snapshots carrying NaN, ±Inf, values beyond 2^24 or that overflow the cache dtype are refused: 400 naming body and the element", async () => {
  const rt = await testRuntime({
    tiers: { fast: "tiny-fast", half: "tiny-fast" },
    tier: {},
  });
  const rtHalf = await testRuntime({ tier: { kv_dtype: "f16" } });
  try {
    const snap = await snapshotOf(rt);
    const app = allApp(rt);
    for (const v of [NaN, Infinity, -Infinity]) {
      const bad = poison(snap, v);
      for (
        const url of [
          "/v1/decode?max_tokens=2",
          "/v1/decode?max_tokens=2&stream=true",
          "/v1/migrate?target=half",
        ]
      ) {
        const res = await app.request(url, { method: "POST", headers: SNAP, body: bad });
        assert.equal(res.status, 400, `${url} ${v}`);
        const err = (await res.json()).error;
        assert.equal(err.type, "invalid_snapshot_error", `${url} ${v}`);
        assert.equal(err.param, "body");
        assert.match(err.message, /finite/);
      }
    }
    // Finite but extreme (3e38, -1e37): beyond the KV bound, whatever the cache dtype; the
    // message names the element. Element 5 of chunk 0's first block: layer 0 K, head 0,
    // token position 0, dim 5.
    const element =
      /layer 0 K, head 0, token position 0, dim 5: value -?[0-9.e+]+ exceeds the KV magnitude bound 16777216/;
    const id = crypto.randomUUID();
    for (const v of [3e38, -1e37]) {
      const bad = poison(snap, v);
      await rt.store.put(await snapshotKey("anonymous", id), bad);
      const requests: [string, RequestInit, string][] = [
        ["/v1/decode?max_tokens=2", { method: "POST", headers: SNAP, body: bad }, "body"],
        [
          "/v1/decode?max_tokens=2&stream=true",
          { method: "POST", headers: SNAP, body: bad },
          "body",
        ],
        ["/v1/migrate?target=half", { method: "POST", headers: SNAP, body: bad }, "body"],
        ["/v1/decode", post({ snapshot_id: id, max_tokens: 2 }), "snapshot_id"],
        ["/v1/decode", post({ snapshot_id: id, stream: true }), "snapshot_id"],
        ["/v1/migrate", post({ snapshot_id: id, target: "half" }), "snapshot_id"],
        ["/v1/migrate", post({ snapshot_id: id, target: "half", store: true }), "snapshot_id"],
      ];
      for (const [url, init, param] of requests) {
        const what = `${url} ${init.body instanceof Uint8Array ? "body" : init.body} ${v}`;
        const res = await app.request(url, init);
        assert.equal(res.status, 400, what);
        const err = (await res.json()).error;
        assert.equal(err.type, "invalid_snapshot_error", what);
        assert.equal(err.param, param, what);
        assert.match(err.message, element, what);
      }
    }
    // 2^24 is accepted (an f32 cache holds it); 1e5 is within the bound but +Inf in an f16 cache.
    const edge = await app.request("/v1/decode?max_tokens=1", {
      method: "POST",
      headers: SNAP,
      body: poison(snap, 2 ** 24),
    });
    assert.equal(edge.status, 200, "the bound itself");
    await edge.arrayBuffer();
    // The f16 tier serves the same model, so the snapshot (f32 payload) imports into f16 KV.
    const res = await allApp(rtHalf).request("/v1/decode?max_tokens=1", {
      method: "POST",
      headers: SNAP,
      body: poison(snap, 1e5),
    });
    assert.equal(res.status, 400);
    assert.match((await res.json()).error.message, /dim 5: value 100000 overflows the f16 cache/);
  } finally {
    await rt.close();
    await rtHalf.close();
  }
});

/** A store whose backend is down: every call fails the way RedisStore does, naming its address. */
class DownStore implements SnapshotStore {
  readonly kind = "redis" as const;
  // The message names the backend's address and a key, as RedisStore's do.
  put(): Promise<void> {
    return Promise.reject(
      new StoreError(
        "unavailable",
        "redis",
        "redis://10.1.2.3:6379 unreachable (key kvrelay:pfx:abc)",
      ),
    );
  }
  get(): Promise<Uint8Array | null> {
    return Promise.reject(
      new StoreError(
        "unavailable",
        "redis",
        "redis://10.1.2.3:6379 unreachable (key kvrelay:pfx:abc)",
      ),
    );
  }
  has(): Promise<boolean> {
    return Promise.reject(
      new StoreError(
        "unavailable",
        "redis",
        "redis://10.1.2.3:6379 unreachable (key kvrelay:pfx:abc)",
      ),
    );
  }
  delete(): Promise<boolean> {
    return Promise.reject(
      new StoreError("unavailable", "redis", "redis://10.1.2.3:6379 unreachable"),
    );
  }
  close(): Promise<void> {
    return Promise.resolve();
  }
}

Deno.test("a store that is down only disables the prefix cache; errors never carry its address or keys", async () => {
  const rt = await testRuntime({ store: new DownStore() });
  try {
    const app = allApp(rt);
    const res = await app.request("/v1/prefill", post({ tier: "fast", prompt }));
    assert.equal(res.status, 200, "prefill degrades to a full prefill");
    const snap = new Uint8Array(await res.arrayBuffer());
    const dec = await app.request("/v1/decode?max_tokens=2", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(dec.status, 200);
    await dec.arrayBuffer();
    const chat = await app.request(
      "/v1/completions",
      post({ model: "fast", prompt, max_tokens: 1 }),
    );
    assert.equal(chat.status, 200);
    await chat.arrayBuffer();
    // Where the store is the point (store: true, snapshot_id), the answer is a 503 that names
    // nothing internal.
    for (
      const [url, body] of [
        ["/v1/prefill", { tier: "fast", prompt, store: true }],
        ["/v1/decode", { snapshot_id: "abc" }],
        ["/v1/migrate", { snapshot_id: "abc", target: "fast" }],
      ] as const
    ) {
      const r = await app.request(url, post(body));
      assert.equal(r.status, 503, url);
      const text = await r.text();
      assert.doesNotMatch(text, /10\.1\.2\.3|redis:\/\/|kvrelay:pfx/, url);
      assert.equal(JSON.parse(text).error.type, "store_unavailable_error");
    }
  } finally {
    await rt.close();
  }
});

Deno.test("a bug's TypeError is a generic 500 naming the request id; bad input stays a precise 400", async () => {
  const rt = await testRuntime();
  try {
    const app = allApp(rt);
    const tok = rt.tiers.get("fast")!.model.tokenizer;
    const orig = tok.encodeAsync.bind(tok);
    tok.encodeAsync = () =>
      Promise.reject(new TypeError("cannot read properties of undefined (internal detail)"));
    const errors: unknown[] = [];
    const origError = console.error;
    console.error = (...a: unknown[]) => errors.push(a);
    let res: Response;
    try {
      res = await app.request(
        "/v1/completions",
        post({ model: "fast", prompt: "hi", max_tokens: 1 }),
      );
    } finally {
      console.error = origError;
      tok.encodeAsync = orig;
    }
    assert.equal(res.status, 500);
    const id = res.headers.get("x-request-id");
    assert.ok(id);
    const body = await res.json();
    assert.equal(body.error.type, "server_error");
    assert.doesNotMatch(body.error.message, /internal detail|undefined/);
    assert.match(body.error.message, new RegExp(id!));
    assert.ok(JSON.stringify(errors).includes(id!), "the error is logged with the request id");
    const bad = await app.request(
      "/v1/completions",
      post({ model: "fast", prompt: "hi", temperature: 9 }),
    );
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.param, "temperature");
  } finally {
    await rt.close();
  }
});

Deno.test("a refused migration says why: the quality gate's reason, not no_projector", async () => {
  const projector = new URL("../../models/projectors/tiny-fast--tiny-powerful", import.meta.url)
    .pathname;
  const rt = await testRuntime({
    tiers: { fast: "tiny-fast", powerful: "tiny-powerful" },
    config: { projectors: [{ from: "fast", to: "powerful", path: projector, min_quality: 1 }] },
  });
  try {
    const snap = await snapshotOf(rt);
    const app = allApp(rt);
    for (const url of ["/v1/decode?tier=powerful&max_tokens=2", "/v1/migrate?target=powerful"]) {
      const res = await app.request(url, { method: "POST", headers: SNAP, body: snap });
      assert.equal(res.status, 422, url);
      const err = (await res.json()).error;
      assert.equal(err.type, "migration_refused_error");
      assert.match(err.message, /quality_below_threshold/, url);
      assert.doesNotMatch(err.message, /no_projector/, url);
    }
  } finally {
    await rt.close();
  }
});

Deno.test("invalid UTF-8 and lone surrogates answer 400; wrong methods 405 with Allow; huge headers 431", async () => {
  const rt = await testRuntime();
  try {
    const app = allApp(rt);
    const bytes = new Uint8Array([
      ...new TextEncoder().encode('{"model": "fast", "prompt": "caf'),
      0xff,
      0xfe,
      ...new TextEncoder().encode('", "max_tokens": 1}'),
    ]);
    const utf8 = await app.request("/v1/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: bytes,
    });
    assert.equal(utf8.status, 400);
    assert.match((await utf8.json()).error.message, /UTF-8/);
    const lone = await app.request(
      "/v1/chat/completions",
      post(null, {}, '{"model": "fast", "messages": [{"role": "user", "content": "a\\ud800b"}]}'),
    );
    assert.equal(lone.status, 400);
    assert.equal((await lone.json()).error.param, "messages.0.content");
    const q = await app.request("/v1/decode?continuation=%FF%FE", {
      method: "POST",
      headers: SNAP,
      body: new Uint8Array(10),
    });
    assert.equal(q.status, 400);
    assert.equal((await q.json()).error.param, "continuation");
    const get = await app.request("/v1/chat/completions");
    assert.equal(get.status, 405);
    assert.equal(get.headers.get("allow"), "POST");
    assert.equal((await get.json()).error.type, "method_not_allowed_error");
    const post2 = await app.request("/healthz", { method: "POST" });
    assert.equal(post2.status, 405);
    assert.match(post2.headers.get("allow") ?? "", /GET/);
    const none = await app.request("/v1/nothing");
    assert.equal(none.status, 404);
    const big = await app.request("/healthz", { headers: { "x-big": "a".repeat(40 * 1024) } });
    assert.equal(big.status, 431);
    assert.equal((await big.json()).error.param, "headers");
  } finally {
    await rt.close();
  }
});

Deno.test("a projection whose output leaves the KV bound is refused (422 naming the element) before it is sent, stored or decoded", async () => {
  const rt = await testRuntime({
    tiers: { fast: "tiny-fast", powerful: "tiny-powerful" },
    config: {
      projectors: [{ from: "fast", to: "powerful", path: "projectors/tiny-fast--tiny-powerful" }],
    },
  });
  try {
    const app = allApp(rt);
    // Every K and V of chunk 0 at +2^24: within the bound, so the import accepts it, but the
    // projector (a ridge map summing many features) carries it far beyond.
    const snap = new Uint8Array(await snapshotOf(rt));
    const { header, layout } = decodeHeader(snap);
    const start = layout.payloadStart + header.chunks[0].offset;
    const frame = snap.subarray(start, start + header.chunks[0].length);
    const dv = new DataView(frame.buffer, frame.byteOffset, frame.byteLength);
    for (let o = 8; o + 4 < frame.length; o += 4) dv.setFloat32(o, 2 ** 24, true);
    dv.setUint32(frame.length - 4, crc32c(frame.subarray(0, frame.length - 4)), true);
    const same = await app.request("/v1/decode?max_tokens=1", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.notEqual(same.status, 400, "the saturated snapshot itself is within the bound");
    await same.arrayBuffer();
    for (
      const url of [
        "/v1/migrate?target=powerful",
        "/v1/migrate?target=powerful&store=true",
        "/v1/decode?tier=powerful&max_tokens=2",
        "/v1/decode?tier=powerful&max_tokens=2&stream=true",
      ]
    ) {
      const res = await app.request(url, { method: "POST", headers: SNAP, body: snap });
      assert.equal(res.status, 422, url);
      const err = (await res.json()).error;
      assert.equal(err.type, "migration_refused_error", url);
      assert.match(
        err.message,
        /projection_out_of_range.*layer \d+ [KV], head \d+, token position \d+, dim \d+: value \S+ (exceeds the KV magnitude bound|is not finite)/,
        url,
      );
    }
  } finally {
    await rt.close();
  }
});
