// Two-process KV handoff: a prefill function on one port hands its snapshot (HMAC-signed) to a
// decode function on another port — streamed over HTTP, and via a shared fs store — and the
// continued text equals a single-process greedy run (lib/engine generate(), the oracle); across
// tiers (fast → powerful through the fitted projector) it equals the same migration in-process.
import assert from "node:assert/strict";
import { continueFrom, generate, loadModel } from "../lib/engine/mod.ts";
import { endpointOf, loadProjector, migrateKv, migrationGate } from "../lib/migrate/mod.ts";
import { freePort, startServer, writeConfig } from "./e2e_support.ts";

const root = new URL("../", import.meta.url).pathname;
const prompt = "It was the best of times, it was the worst of times, it was the age of wisdom";
const projectorDir = `${root}models/projectors/tiny-fast--tiny-powerful`;
// The demo projector is committed: its absence is a failure, not a reason to skip.

const json = (body: unknown) => ({
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify(body),
});

Deno.test("prefill on one process, decode on another: HTTP and shared-store handoffs equal one process", async (t) => {
  const storeDir = await Deno.makeTempDir({ prefix: "kvrelay-store-" });
  const decodePort = freePort();
  const store = { store: { kind: "fs", dir: storeDir } };
  const decodeCfg = await writeConfig(
    { fast: "tiny-fast", powerful: "tiny-powerful" },
    {},
    {
      ...store,
      projectors: [{ from: "fast", to: "powerful", path: projectorDir, min_quality: 0.5 }],
    },
  );
  const prefillCfg = await writeConfig({ fast: "tiny-fast" }, {}, {
    ...store,
    peers: { decoder: `http://127.0.0.1:${decodePort}` },
  });
  const env = { KVRELAY_SNAPSHOT_KEY: "handoff-test-key-0123456789", KVRELAY_TENANT_SALT: "t" };
  const [decoder, prefiller] = await Promise.all([
    startServer("functions/decode/main.ts", {
      ...env,
      KVRELAY_CONFIG: decodeCfg,
      PORT: String(decodePort),
    }),
    startServer("functions/prefill/main.ts", { ...env, KVRELAY_CONFIG: prefillCfg }),
  ]);
  const fast = await loadModel(`${root}models/tiny-fast`, { threads: 1 });
  try {
    const expected = await generate(fast, prompt, { maxTokens: 12, temperature: 0 });

    await t.step(
      "streamed over HTTP to the peer (signed), same tier: equal to generate()",
      async () => {
        const res = await fetch(
          `${prefiller.base}/v1/prefill`,
          json({ tier: "fast", prompt, forward_to: "decoder", decode: { max_tokens: 12 } }),
        );
        assert.equal(res.status, 200);
        assert.equal((await res.json()).text, expected.text);
      },
    );

    await t.step("through the shared fs store by snapshot id: equal to generate()", async () => {
      const stored = await (await fetch(
        `${prefiller.base}/v1/prefill`,
        json({ tier: "fast", prompt, store: true }),
      )).json();
      const b = await (await fetch(
        `${decoder.base}/v1/decode`,
        json({ snapshot_id: stored.snapshot_id, max_tokens: 12 }),
      )).json();
      assert.equal(b.text, expected.text);
    });

    await t.step("a tampered snapshot is refused before import", async () => {
      const snap = await fetch(`${prefiller.base}/v1/prefill`, json({ tier: "fast", prompt }));
      const bytes = new Uint8Array(await snap.arrayBuffer());
      bytes[bytes.length - 1] ^= 1; // the last chunk's HMAC tag
      const res = await fetch(`${decoder.base}/v1/decode?tier=fast`, {
        method: "POST",
        headers: { "content-type": "application/vnd.kvrelay.snapshot" },
        body: bytes,
      });
      assert.equal(res.status, 401);
      await res.body?.cancel();
      const metrics = await (await fetch(`${decoder.base}/metrics`)).text();
      assert.match(metrics, /kvrelay_snapshot_bytes_total\{direction="in"\} [1-9]/);
    });

    await t.step({
      name:
        "across tiers (fast → powerful): projected + repaired, equal to the same migration in one process",
      fn: async () => {
        const powerful = await loadModel(`${root}models/tiny-powerful`, { threads: 1 });
        const projector = await loadProjector(projectorDir, endpointOf(fast), endpointOf(powerful));
        try {
          const gate = migrationGate(projector.meta, { minKlRecovered: 0.5 }, {
            sourceFingerprint: fast.fingerprint,
            targetFingerprint: powerful.fingerprint,
            sourceTokenizer: fast.tokenizer.fingerprint,
            targetTokenizer: powerful.tokenizer.fingerprint,
          });
          assert.ok(gate.allow);
          // One process: prefill all but the last token on fast, project, repair, decode.
          const ids = fast.tokenizer.encode(prompt);
          const kv = ids.slice(0, -1);
          const keep = kv.length - gate.repair;
          const src = fast.native.createSequence(kv.length);
          const tgt = powerful.native.createSequence(ids.length + 12);
          let oracle: string;
          try {
            await src.prefill(kv);
            await migrateKv({
              source: endpointOf(fast),
              sourceSeq: src,
              target: endpointOf(powerful),
              targetSeq: tgt,
              projector,
              count: keep,
              threads: 1,
            });
            const logits = await tgt.prefill(ids.slice(keep));
            oracle = (await continueFrom(powerful, tgt, logits, {
              maxTokens: 12,
              temperature: 0,
              contextIds: ids.slice(-8),
            })).text;
          } finally {
            src.free();
            tgt.free();
          }
          const res = await fetch(
            `${prefiller.base}/v1/prefill`,
            json({
              tier: "fast",
              prompt,
              forward_to: "decoder",
              decode: { tier: "powerful", max_tokens: 12 },
            }),
          );
          assert.equal(res.status, 200);
          const body = await res.json();
          assert.equal(body.migrated, true);
          assert.equal(body.source_tier, "fast");
          assert.equal(body.reused_tokens, keep);
          assert.equal(body.text, oracle);
        } finally {
          await projector.free();
          powerful.native.free();
        }
      },
    });
  } finally {
    fast.native.free();
    await prefiller.stop();
    await decoder.stop();
    for (const c of [decodeCfg, prefillCfg]) {
      await Deno.remove(c.slice(0, c.lastIndexOf("/")), { recursive: true });
    }
    await Deno.remove(storeDir, { recursive: true });
  }
});
