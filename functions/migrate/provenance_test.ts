// The handoff's provenance and content types through the real routes (app.request): a snapshot
// migrated by /v1/migrate tells a later /v1/decode where its KV came from (source tier, migrated,
// repair), a handoff that carries no KV says why with a stable code (field and header), and
// snapshot uploads are accepted as application/octet-stream and refused without a content type
// with a 415 naming the snapshot type. Oracle: /v1/decode migrating the same snapshot itself.
import assert from "node:assert/strict";
import { decodeHeader } from "../../lib/snapshot/mod.ts";
import type { Runtime } from "../../lib/serve/mod.ts";
import { createDecodeApp } from "../decode/app.ts";
import { createPrefillApp } from "../prefill/app.ts";
import { post, testRuntime } from "../shared/test_helpers.ts";
import { createMigrateApp } from "./app.ts";

const SNAP = { "content-type": "application/vnd.kvrelay.snapshot" };
const longPrompt = "Fellow-Citizens of the Senate and House of Representatives: In meeting you " +
  "again I feel much satisfaction in being able to repeat my congratulations on the favorable " +
  "prospects which continue to distinguish our public affairs.";
const shortPrompt = "Call me Ishmael."; // fewer KV tokens than the projector's repair length

function runtime(): Promise<Runtime> {
  return testRuntime({
    tiers: { fast: "tiny-fast", powerful: "tiny-powerful" },
    config: {
      projectors: [{ from: "fast", to: "powerful", path: "projectors/tiny-fast--tiny-powerful" }],
    },
  });
}

async function prefill(rt: Runtime, prompt: string): Promise<Uint8Array<ArrayBuffer>> {
  const res = await createPrefillApp(rt).request("/v1/prefill", post({ tier: "fast", prompt }));
  assert.equal(res.status, 200);
  return new Uint8Array(await res.arrayBuffer());
}

function upload(url: string, body: Uint8Array<ArrayBuffer>, headers: HeadersInit = SNAP) {
  return [url, { method: "POST", headers, body }] as const;
}

Deno.test("/v1/migrate output carries provenance: /v1/decode reports source tier, migrated and repair as a direct migration does", async () => {
  const rt = await runtime();
  try {
    const snap = await prefill(rt, longPrompt);
    const migrated = await createMigrateApp(rt).request(
      ...upload("/v1/migrate?target=powerful", snap),
    );
    assert.equal(migrated.status, 200);
    assert.equal(migrated.headers.get("x-kvrelay-migration-reason"), null);
    const repair = Number(migrated.headers.get("x-kvrelay-repair-tokens"));
    const kept = Number(migrated.headers.get("x-kvrelay-migrated-tokens"));
    assert.ok(kept > 0, "a long prompt migrates");
    const bytes = new Uint8Array(await migrated.arrayBuffer());
    const header = decodeHeader(bytes).header;
    assert.equal(header.provenance?.migrated, true);
    assert.equal(
      header.provenance?.sourceModelFingerprint,
      rt.tiers.get("fast")!.model.fingerprint,
    );

    const decode = createDecodeApp(rt);
    const later = await (await decode.request(
      ...upload("/v1/decode?max_tokens=8", bytes),
    )).json();
    const direct = await (await decode.request(
      ...upload("/v1/decode?tier=powerful&max_tokens=8", snap),
    )).json();
    assert.equal(direct.migrated, true);
    assert.equal(later.tier, "powerful");
    assert.equal(later.source_tier, "fast");
    assert.equal(later.migrated, true);
    assert.equal(later.migration_reason, null);
    assert.equal(later.repair_tokens, repair);
    assert.equal(later.reused_tokens, kept);
    assert.equal(later.reused_tokens, direct.reused_tokens);
    assert.equal(later.repair_tokens, direct.repair_tokens);
    assert.equal(later.text, direct.text);
    // Sampling too: the migrated snapshot decodes with the projector's logit temperature.
    const sampled = "max_tokens=24&temperature=1.5&seed=3";
    const laterSampled = await (await decode.request(
      ...upload(`/v1/decode?${sampled}`, bytes),
    )).json();
    const directSampled = await (await decode.request(
      ...upload(`/v1/decode?tier=powerful&${sampled}`, snap),
    )).json();
    assert.equal(laterSampled.text, directSampled.text);

    // Through the store: the same provenance by id.
    const stored = await (await createMigrateApp(rt).request(
      ...upload("/v1/migrate?target=powerful&store=true", snap),
    )).json();
    assert.equal(stored.migration_reason, null);
    const byId = await (await decode.request(
      "/v1/decode",
      post({ snapshot_id: stored.snapshot_id, max_tokens: 8 }),
    )).json();
    assert.deepEqual(
      [byId.source_tier, byId.migrated, byId.repair_tokens, byId.text],
      [later.source_tier, later.migrated, later.repair_tokens, later.text],
    );
  } finally {
    await rt.close();
  }
});

Deno.test("a handoff that carries no KV says why: prompt_too_short in the field and the header", async () => {
  const rt = await runtime();
  try {
    const snap = await prefill(rt, shortPrompt);
    const migrate = createMigrateApp(rt), decode = createDecodeApp(rt);
    const res = await migrate.request(...upload("/v1/migrate?target=powerful", snap));
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("x-kvrelay-migrated-tokens"), "0");
    assert.equal(res.headers.get("x-kvrelay-migration-reason"), "prompt_too_short");
    const bytes = new Uint8Array(await res.arrayBuffer());
    const stored = await (await migrate.request(
      ...upload("/v1/migrate?target=powerful&store=true", snap),
    )).json();
    assert.equal(stored.migrated_tokens, 0);
    assert.equal(stored.migration_reason, "prompt_too_short");

    const later = await decode.request(...upload("/v1/decode?max_tokens=4", bytes));
    assert.equal(later.headers.get("x-kvrelay-migration-reason"), "prompt_too_short");
    const body = await later.json();
    assert.deepEqual(
      [body.source_tier, body.migrated, body.migration_reason, body.reused_tokens],
      ["fast", false, "prompt_too_short", 0],
    );
    // The same when /v1/decode is asked to migrate the short snapshot itself.
    const direct = await decode.request(...upload("/v1/decode?tier=powerful&max_tokens=4", snap));
    assert.equal(direct.headers.get("x-kvrelay-migration-reason"), "prompt_too_short");
    const d = await direct.json();
    assert.deepEqual([d.source_tier, d.migrated, d.migration_reason], [
      "fast",
      false,
      "prompt_too_short",
    ]);
    assert.equal(d.text, body.text);
    // A same-tier decode has nothing to explain.
    const own = await decode.request(...upload("/v1/decode?max_tokens=4", snap));
    assert.equal(own.headers.get("x-kvrelay-migration-reason"), null);
    assert.equal((await own.json()).migration_reason, null);
  } finally {
    await rt.close();
  }
});

Deno.test("snapshot uploads: application/octet-stream accepted; no or a form content type is a 415 naming the snapshot type", async () => {
  const rt = await testRuntime();
  try {
    const snap = await prefill(rt, shortPrompt);
    const decodeApp = createDecodeApp(rt), migrateApp = createMigrateApp(rt);
    const want = await (await decodeApp.request(
      ...upload("/v1/decode?max_tokens=4", snap),
    )).json();
    const octet = { "content-type": "application/octet-stream" };
    const got = await (await decodeApp.request(
      ...upload("/v1/decode?max_tokens=4", snap, octet),
    )).json();
    assert.equal(got.text, want.text);
    const m = await migrateApp.request(...upload("/v1/migrate?target=fast", snap, octet));
    assert.equal(m.status, 200);
    // Octet-stream bytes that are not a snapshot: refused at the magic, naming the body.
    const junk = await decodeApp.request(
      ...upload("/v1/decode", new TextEncoder().encode('{"snapshot_id":"x"}'), octet),
    );
    assert.equal(junk.status, 400);
    assert.equal((await junk.json()).error.param, "body");
    const types: Record<string, string>[] = [{}, {
      "content-type": "application/x-www-form-urlencoded",
    }];
    for (const headers of types) {
      for (
        const [url, app] of [["/v1/decode", decodeApp], [
          "/v1/migrate?target=fast",
          migrateApp,
        ]] as const
      ) {
        const res = await app.request(url, { method: "POST", headers, body: snap });
        assert.equal(res.status, 415, `${url} ${JSON.stringify(headers)}`);
        const err = (await res.json()).error;
        assert.equal(err.param, "content-type");
        assert.match(err.message, /application\/vnd\.kvrelay\.snapshot/);
        assert.match(err.message, /application\/json/);
      }
    }
  } finally {
    await rt.close();
  }
});
