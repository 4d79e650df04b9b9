// Route tests for the migrate function via app.request(): same-model migration (exact copy) whose
// result decodes to generate()'s greedy text, and the refusals: 422 no usable projector, 404
// unknown target, 409 snapshot of a model no tier serves, 400 bad query.
import assert from "node:assert/strict";
import { generate } from "../../lib/engine/mod.ts";
import { snapshotKey } from "../../lib/serve/mod.ts";
import { decodeHeader } from "../../lib/snapshot/mod.ts";
import { createDecodeApp } from "../decode/app.ts";
import { createPrefillApp } from "../prefill/app.ts";
import { post, testRuntime } from "../shared/test_helpers.ts";
import { createMigrateApp } from "./app.ts";

const prompt = "Call me Ishmael. Some years ago, never mind how long";
const SNAP = { "content-type": "application/vnd.kvrelay.snapshot" };

Deno.test("POST /v1/migrate between same-model tiers copies KV; the result decodes like generate()", async () => {
  const rt = await testRuntime({
    tiers: { fast: "tiny-fast", fast2: "tiny-fast", powerful: "tiny-powerful" },
  });
  try {
    const stored = await (await createPrefillApp(rt).request(
      "/v1/prefill",
      post({ tier: "fast", prompt, store: true }),
    )).json();
    const res = await createMigrateApp(rt).request(
      "/v1/migrate",
      post({ snapshot_id: stored.snapshot_id, target: "fast2" }),
    );
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("x-kvrelay-source-tier"), "fast");
    const bytes = new Uint8Array(await res.arrayBuffer());
    const model = rt.tiers.get("fast")!.model;
    assert.equal(
      decodeHeader(bytes).header.tokenIds.length,
      model.tokenizer.encode(prompt).length - 1,
    );
    const dec = await (await createDecodeApp(rt).request("/v1/decode?tier=fast2&max_tokens=8", {
      method: "POST",
      headers: SNAP,
      body: bytes,
    })).json();
    assert.equal(dec.text, (await generate(model, prompt, { maxTokens: 8, temperature: 0 })).text);
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/migrate refuses with 422 without a usable projector, 404 for unknown targets", async () => {
  const rt = await testRuntime({
    tiers: { fast: "tiny-fast", powerful: "tiny-powerful" },
    config: { projectors: [{ from: "fast", to: "powerful", path: "/nonexistent/projector" }] },
  });
  try {
    const snap = new Uint8Array(
      await (await createPrefillApp(rt).request("/v1/prefill", post({ tier: "fast", prompt })))
        .arrayBuffer(),
    );
    const app = createMigrateApp(rt);
    const refused = await app.request("/v1/migrate?target=powerful", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(refused.status, 422);
    const err = (await refused.json()).error;
    assert.equal(err.type, "migration_refused_error");
    assert.match(err.message, /not loaded/);
    const unknown = await app.request("/v1/migrate?target=giant", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(unknown.status, 404);
    assert.equal((await unknown.json()).error.param, "target");
    const noTarget = await app.request("/v1/migrate", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(noTarget.status, 400);
    assert.equal((await noTarget.json()).error.param, "target");
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/migrate answers 409 for a snapshot of a model no tier serves", async () => {
  const src = await testRuntime();
  const rt = await testRuntime({ tiers: { balanced: "tiny-balanced" } });
  try {
    const snap = new Uint8Array(
      await (await createPrefillApp(src).request("/v1/prefill", post({ tier: "fast", prompt })))
        .arrayBuffer(),
    );
    const res = await createMigrateApp(rt).request("/v1/migrate?target=balanced", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(res.status, 409);
  } finally {
    await src.close();
    await rt.close();
  }
});

Deno.test("POST /v1/migrate errors name the field: body or snapshot_id for bad snapshots, target for a refusal", async () => {
  const rt = await testRuntime({ tiers: { fast: "tiny-fast", balanced: "tiny-balanced" } });
  try {
    const res = await createPrefillApp(rt).request("/v1/prefill", post({ tier: "fast", prompt }));
    const snap = new Uint8Array(await res.arrayBuffer());
    const app = createMigrateApp(rt);
    const refused = await app.request("/v1/migrate?target=balanced", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(refused.status, 422);
    assert.equal((await refused.json()).error.param, "target");
    const truncated = snap.slice(0, 100);
    const bad = await app.request("/v1/migrate?target=fast", {
      method: "POST",
      headers: SNAP,
      body: truncated,
    });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.param, "body");
    const id = crypto.randomUUID();
    await rt.store.put(await snapshotKey("anonymous", id), truncated);
    const stored = await app.request("/v1/migrate", post({ snapshot_id: id, target: "fast" }));
    assert.equal(stored.status, 400);
    assert.equal((await stored.json()).error.param, "snapshot_id");
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/migrate answers 400 naming body, not 500, when the snapshot upload breaks off", async () => {
  const rt = await testRuntime();
  try {
    const snap = new Uint8Array(
      await (await createPrefillApp(rt).request("/v1/prefill", post({ tier: "fast", prompt })))
        .arrayBuffer(),
    );
    const broken = new ReadableStream<Uint8Array>({
      start(ctl) {
        ctl.enqueue(snap.slice(0, 1000)); // a valid prefix and header, then the connection breaks
      },
      pull(ctl) {
        ctl.error(new Error("connection reset by peer"));
      },
    });
    const res = await createMigrateApp(rt).request("/v1/migrate?target=fast", {
      method: "POST",
      headers: SNAP,
      body: broken,
    });
    assert.equal(res.status, 400);
    const body = await res.json();
    assert.equal(body.error.param, "body");
    assert.match(body.error.message, /connection reset by peer/);
  } finally {
    await rt.close();
  }
});
