// Tenant isolation through the real app (app.request): a stored snapshot is found only by the
// tenant (API key) that stored it — another tenant gets the same 404 as for an id that never
// existed, on every route taking a snapshot_id and over the memory, fs and redis stores — sticky
// routes are scoped by tenant, and /metrics answers only with its key when one is configured.
import assert from "node:assert/strict";
import { RedisServer, redisTestGate } from "../../tests/support/redis_server.ts";
import type { Runtime } from "../../lib/serve/mod.ts";
import { registerDecode } from "../decode/app.ts";
import { registerGenerate } from "../generate/app.ts";
import { registerMigrate } from "../migrate/app.ts";
import { registerPrefill } from "../prefill/app.ts";
import { createBaseApp } from "./app.ts";
import { type Json, post, testRuntime } from "./test_helpers.ts";

const KEYS = "alice:key-a,bob:key-b";
const A = { authorization: "Bearer key-a" };
const B = { authorization: "Bearer key-b" };
const prompt = "It was the best of times, it was the worst of times";

function allApp(rt: Runtime) {
  const app = createBaseApp(rt, "all");
  registerGenerate(app, rt);
  registerPrefill(app, rt);
  registerDecode(app, rt);
  registerMigrate(app, rt);
  return app;
}

/** The error of a 404 with the id blanked out, to compare with the answer for an unknown id. */
async function notFound(res: Response, id: string): Promise<Json> {
  assert.equal(res.status, 404);
  const err = (await res.json()).error;
  return { ...err, message: err.message.replaceAll(id, "<id>") };
}

async function checkSnapshotIsolation(rt: Runtime): Promise<void> {
  const app = allApp(rt);
  const stored = await app.request(
    "/v1/prefill",
    post({ tier: "fast", prompt, store: true }, A),
  );
  assert.equal(stored.status, 200, await stored.clone().text());
  const id: string = (await stored.json()).snapshot_id;
  const unknown = crypto.randomUUID();
  const routes: [string, Record<string, unknown>][] = [
    ["/v1/decode", { max_tokens: 2 }],
    ["/v1/decode", { max_tokens: 2, stream: true }],
    ["/v1/migrate", { target: "fast2" }],
    ["/v1/migrate", { target: "fast2", store: true }],
  ];
  for (const [url, extra] of routes) {
    const what = `${url} ${JSON.stringify(extra)}`;
    const theirs = await app.request(url, post({ snapshot_id: id, ...extra }, B));
    const never = await app.request(url, post({ snapshot_id: unknown, ...extra }, B));
    // Bob cannot tell Alice's id from one that never existed.
    assert.deepEqual(await notFound(theirs, id), await notFound(never, unknown), what);
    const mine = await app.request(url, post({ snapshot_id: id, ...extra }, A));
    assert.equal(mine.status, 200, what);
    await mine.arrayBuffer();
  }
  // A snapshot migrate stores belongs to the tenant that asked for it.
  const migrated = await app.request(
    "/v1/migrate",
    post({ snapshot_id: id, target: "fast2", store: true }, A),
  );
  const mid: string = (await migrated.json()).snapshot_id;
  await notFound(await app.request("/v1/decode", post({ snapshot_id: mid }, B)), mid);
  const ok = await app.request("/v1/decode", post({ snapshot_id: mid, max_tokens: 2 }, A));
  assert.equal(ok.status, 200);
  await ok.arrayBuffer();
}

const tiers = { fast: "tiny-fast", fast2: "tiny-fast" };

Deno.test("a stored snapshot is bound to its tenant: another tenant's decode/migrate by id is a 404 like an unknown id (memory store)", async () => {
  const rt = await testRuntime({ tiers, env: { KVRELAY_API_KEYS: KEYS } });
  try {
    await checkSnapshotIsolation(rt);
  } finally {
    await rt.close();
  }
});

Deno.test("a stored snapshot is bound to its tenant over the fs store", async () => {
  const dir = await Deno.makeTempDir({ prefix: "kvr-tenancy-" });
  const rt = await testRuntime({
    tiers,
    env: { KVRELAY_API_KEYS: KEYS },
    config: { store: { kind: "fs", dir } },
  });
  try {
    await checkSnapshotIsolation(rt);
  } finally {
    await rt.close();
    await Deno.remove(dir, { recursive: true });
  }
});

const gate = redisTestGate();
Deno.test({
  name: "a stored snapshot is bound to its tenant over the redis store" + gate.suffix,
  ignore: gate.ignore,
  fn: async () => {
    const server = await RedisServer.start();
    try {
      const rt = await testRuntime({
        tiers,
        env: { KVRELAY_API_KEYS: KEYS, KVRELAY_REDIS_URL: server.url },
        config: { store: { kind: "redis" } },
      });
      try {
        await checkSnapshotIsolation(rt);
      } finally {
        await rt.close();
      }
    } finally {
      await server.dispose();
    }
  },
});

Deno.test("sticky routes are per tenant: another tenant's same user id neither sees nor pins the escalated tier", async () => {
  const rt = await testRuntime({
    tiers: { fast: "tiny-fast", powerful: "tiny-powerful" },
    env: { KVRELAY_API_KEYS: KEYS },
  });
  try {
    const app = allApp(rt);
    const gen = async (headers: Record<string, string>, text: string) => {
      const res = await app.request(
        "/v1/generate",
        post({ prompt: text, user_id: "u1", max_tokens: 1 }, headers),
      );
      assert.equal(res.status, 200);
      const body = await res.json();
      return `${body.tier}/${body.route}`;
    };
    assert.equal(await gen(A, "Please explain the tides"), "powerful/rule");
    assert.equal(await gen(A, "hi"), "powerful/sticky");
    // Bob's "u1" is another conversation: nothing of Alice's escalation shows.
    assert.equal(await gen(B, "hi"), "fast/default");
    // Bob escalating his "u1" does not pin Alice's... and Alice's own stays hers.
    assert.equal(await gen(B, "Please explain why"), "powerful/rule");
    const other = await app.request(
      "/v1/generate",
      post({ prompt: "hi", user_id: "u2", max_tokens: 1 }, A),
    );
    assert.equal((await other.json()).tier, "fast");
    assert.equal(await gen(A, "hi"), "powerful/sticky");
  } finally {
    await rt.close();
  }
});

Deno.test("GET /metrics with auth.metrics_key_env: 401 without the key or with an API key, 200 with it", async () => {
  const rt = await testRuntime({
    env: { KVRELAY_API_KEYS: KEYS, KVRELAY_METRICS_KEY: "scrape-secret" },
    config: { auth: { metrics_key_env: "KVRELAY_METRICS_KEY" } },
  });
  const open = await testRuntime({ load: false });
  try {
    const app = allApp(rt);
    for (const headers of [{}, A, { authorization: "Bearer scrape-secre" }]) {
      const res = await app.request("/metrics", { headers });
      assert.equal(res.status, 401, JSON.stringify(headers));
      assert.equal((await res.json()).error.type, "authentication_error");
      assert.match(res.headers.get("www-authenticate") ?? "", /^Bearer/);
    }
    const res = await app.request("/metrics", {
      headers: { authorization: "Bearer scrape-secret" },
    });
    assert.equal(res.status, 200);
    assert.match(await res.text(), /^# (HELP|TYPE) kvrelay_/m);
    // The probes stay open; without the field /metrics is open too.
    assert.equal((await app.request("/healthz")).status, 200);
    assert.equal((await allApp(open).request("/metrics")).status, 200);
  } finally {
    await rt.close();
    await open.close();
  }
});
