// KV handoff across real network hosts: the prefill function (fast tier), the decode function
// (fast + powerful tiers) and redis-server each run in their own network namespace with their own
// address, joined by a wire with 1 ms one-way delay (2 ms RTT) and a 1 Gbit/s cap per sender
// (tests/support/netns.ts). Checks that peer and store handoffs give the same greedy text as one
// process (lib/engine generate()), that the snapshot streams (the decode host reads the import
// before the prefill host has finished encoding), that killing the decode host — or cutting its
// link — mid-handoff gives the client a clean 503 within the request deadline while the prefill
// host stays healthy, and that killing redis mid-stream loses no acknowledged snapshot.
// Needs root, iproute2, python3, /dev/net/tun and redis-server; skipped with the reason otherwise.
import assert from "node:assert/strict";
import { generate, type LoadedModel, loadModel } from "../lib/engine/mod.ts";
import { NetLab, netLabUnavailable } from "./support/netns.ts";
import {
  fetchStatus,
  HostedFunction,
  HostedRedis,
  LAB_PORT as PORT,
  waitFor,
} from "./support/lab_hosts.ts";
import { findRedisServer, REDIS_INSTALL_HINT } from "./support/redis_server.ts";
import { readValidSample } from "./support/corpus.ts";
import { NEUTRAL_SAMPLING } from "./e2e_support.ts";

const root = new URL("../", import.meta.url).pathname;
const DEADLINE_MS = 8000;
const MAX_TOKENS = 12;
const WIRE = { delayMs: 1, rateMbit: 1000 };

const skip = netLabUnavailable() ??
  (findRedisServer() === null ? `redis-server is missing (${REDIS_INSTALL_HINT})` : null);

// deno-lint-ignore no-explicit-any
type Json = any;

async function writeConfigs(
  dir: string,
  lab: NetLab,
): Promise<{ prefill: string; decode: string }> {
  const tier = (model: string) => ({
    model: `${root}models/${model}`,
    threads: 1,
    max_context: 4096,
    max_new_tokens: 256,
    request_timeout_ms: DEADLINE_MS,
    // Greedy: the texts are compared with a one-process greedy generation.
    sampling: NEUTRAL_SAMPLING,
  });
  const common = {
    server: { port: PORT, shutdown_grace_ms: 2000 },
    store: { kind: "redis", url_env: "KVRELAY_REDIS_URL" },
    // The snapshot path is under test; prefix-cache writes would add more redis traffic.
    prefix_cache: { enabled: false },
  };
  const prefill = `${dir}/prefill.json`;
  const decode = `${dir}/decode.json`;
  await Deno.writeTextFile(
    prefill,
    JSON.stringify({
      ...common,
      tiers: { fast: tier("tiny-fast") },
      peers: { decoder: `http://${lab.host("decode").addr}:${PORT}` },
    }),
  );
  await Deno.writeTextFile(
    decode,
    JSON.stringify({
      ...common,
      tiers: { fast: tier("tiny-fast"), powerful: tier("tiny-powerful") },
      projectors: [{
        from: "fast",
        to: "powerful",
        path: `${root}models/projectors/tiny-fast--tiny-powerful`,
        min_quality: 0.5,
      }],
    }),
  );
  return { prefill, decode };
}

function metric(text: string, name: string, labels: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${name}{${labels}}`));
  return line ? Number(line.split(" ").pop()) : 0;
}

const post = (url: string, body: unknown) =>
  fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });

/** Prompts of about `tokens` tokens each, cut from the bundled validation text. */
function prompts(model: LoadedModel, text: string, n: number, tokens: number): string[] {
  const ids = model.tokenizer.encode(text);
  const out: string[] = [];
  for (let i = 0; i < n; i++) {
    out.push(model.tokenizer.decode(ids.slice(i * 97, i * 97 + tokens)));
  }
  return out;
}

Deno.test({
  name: `handoff across three network hosts (2 ms RTT, 1 Gbit/s)${
    skip ? ` (skipped: ${skip})` : ""
  }`,
  ignore: skip !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const dir = await Deno.makeTempDir({ prefix: "kvrelay-multihost-" });
    const lab = await NetLab.create(["prefill", "decode", "redis"], WIRE);
    const fast = await loadModel(`${root}models/tiny-fast`, { threads: 1 });
    try {
      const cfg = await writeConfigs(dir, lab);
      const redis = new HostedRedis(lab, dir);
      await redis.start();
      const env = {
        KVRELAY_SNAPSHOT_KEY: "multihost-test-key-0123456789",
        KVRELAY_TENANT_SALT: "t",
        KVRELAY_REDIS_URL: `redis://${redis.addr}:6379`,
      };
      const prefill = new HostedFunction(lab, "prefill", "functions/prefill/main.ts", {
        ...env,
        KVRELAY_CONFIG: cfg.prefill,
      });
      const decode = new HostedFunction(lab, "decode", "functions/decode/main.ts", {
        ...env,
        KVRELAY_CONFIG: cfg.decode,
      });
      await Promise.all([prefill.start(), decode.start()]);
      const sample = await readValidSample();
      const [long] = prompts(fast, sample, 1, 3000);
      const expected = (await generate(fast, long, { maxTokens: MAX_TOKENS, temperature: 0 })).text;

      await t.step("peer handoff equals one process, and the snapshot streams", async () => {
        const res = await post(`${prefill.base}/v1/prefill`, {
          tier: "fast",
          prompt: long,
          forward_to: "decoder",
          decode: { max_tokens: MAX_TOKENS },
        });
        const body = await res.json();
        assert.equal(res.status, 200, JSON.stringify(body));
        assert.equal(body.text, expected);
        const [exportFirst, exportLast] = res.headers.get("x-kvrelay-export-ms")!.split(",")
          .map(Number);
        const [importFirst, importLast] = res.headers.get("x-kvrelay-import-ms")!.split(",")
          .map(Number);
        // Streaming: the decode host was reading (and importing) before the prefill host had
        // encoded the last chunk.
        const overlap = exportLast - importFirst;
        console.log(
          `    export ${(exportLast - exportFirst).toFixed(1)} ms, import ${
            (importLast - importFirst).toFixed(1)
          } ms, overlap ${overlap.toFixed(1)} ms`,
        );
        assert.ok(overlap > 0, `import started ${-overlap} ms after the export finished`);
      });

      await t.step("store handoff through redis on its own host equals one process", async () => {
        const stored = await (await post(`${prefill.base}/v1/prefill`, {
          tier: "fast",
          prompt: long,
          store: true,
        })).json();
        assert.match(stored.snapshot_id, /^[0-9a-f-]{36}$/);
        const res = await post(`${decode.base}/v1/decode`, {
          snapshot_id: stored.snapshot_id,
          max_tokens: MAX_TOKENS,
        });
        assert.equal((await res.json()).text, expected);
      });

      await t.step("killing redis mid-stream loses no acknowledged snapshot", async () => {
        const texts = prompts(fast, sample, 8, 1200);
        const oracle: string[] = [];
        for (const p of texts) {
          oracle.push((await generate(fast, p, { maxTokens: MAX_TOKENS, temperature: 0 })).text);
        }
        const acked: { i: number; id: string }[] = [];
        const failed: { i: number; status: number; type: string }[] = [];
        let killed: Promise<void> | null = null;
        const next = { i: 0 };
        const worker = async () => {
          while (next.i < texts.length) {
            const i = next.i++;
            const res = await post(`${prefill.base}/v1/prefill`, {
              tier: "fast",
              prompt: texts[i],
              store: true,
            });
            const body = await res.json();
            if (res.status === 200) acked.push({ i, id: body.snapshot_id });
            else failed.push({ i, status: res.status, type: body.error?.type });
            if (acked.length === 3 && killed === null) killed = redis.kill();
          }
        };
        await Promise.all([worker(), worker()]);
        await killed;
        assert.ok(failed.length > 0, "redis was killed before any request could fail");
        for (const f of failed) assert.equal(f.status, 503, JSON.stringify(f));
        await redis.start();
        // The stores fail fast (503) until their client has reconnected in the background.
        let answered = 0;
        const decodeStored = async (id: string) => {
          const res = await post(`${decode.base}/v1/decode`, {
            snapshot_id: id,
            max_tokens: MAX_TOKENS,
          });
          return { res, body: await res.json() };
        };
        await waitFor(
          async () => {
            const { res } = await decodeStored(acked[0].id);
            answered = res.status;
            return res.status !== 503;
          },
          15_000,
          () => `the decode host's store did not come back (last status ${answered})`,
        );
        for (const { i, id } of acked) {
          const { res, body } = await decodeStored(id);
          assert.equal(res.status, 200, `acknowledged snapshot ${i} lost: ${JSON.stringify(body)}`);
          assert.equal(body.text, oracle[i]);
        }
      });

      const midHandoff = async (cut: () => Promise<void>) => {
        // A slow sender, so the transfer is still running when the decode host goes away.
        await lab.shape("prefill", { delayMs: 1, rateMbit: 16 });
        try {
          const before = metric(
            await (await fetch(`${decode.base}/metrics`)).text(),
            "kvrelay_snapshot_bytes_total",
            'direction="in"',
          );
          const t0 = performance.now();
          const pending = post(`${prefill.base}/v1/prefill`, {
            tier: "fast",
            prompt: long,
            forward_to: "decoder",
            decode: { max_tokens: MAX_TOKENS },
          });
          await waitFor(
            async () => {
              const m = await (await fetch(`${decode.base}/metrics`)).text();
              return metric(m, "kvrelay_snapshot_bytes_total", 'direction="in"') > before;
            },
            5000,
            () => "the decode host never started receiving",
          );
          await cut();
          const res = await pending;
          const body = await res.json();
          const elapsed = performance.now() - t0;
          assert.equal(res.status, 503, JSON.stringify(body));
          assert.equal(body.error.type, "peer_unavailable_error");
          assert.ok(elapsed < DEADLINE_MS + 1500, `answered after ${elapsed} ms`);
          console.log(`    client answered 503 after ${elapsed.toFixed(0)} ms`);
        } finally {
          await lab.shape("prefill", WIRE);
        }
        // The prefill host is healthy: probes answer, its sequence and slot were released, and
        // it serves the next request.
        assert.equal(await fetchStatus(`${prefill.base}/healthz`), 200);
        assert.equal(await fetchStatus(`${prefill.base}/readyz`), 200);
        await waitFor(
          async () => {
            const m = await (await fetch(`${prefill.base}/metrics`)).text();
            return metric(m, "kvrelay_active_sequences", 'tier="fast"') === 0;
          },
          3000,
          () => "the prefill host kept the handoff's sequence",
        );
        const again = await post(`${prefill.base}/v1/prefill`, { tier: "fast", prompt: long });
        assert.equal(again.status, 200);
        assert.ok((await again.arrayBuffer()).byteLength > 0);
      };

      await t.step(
        "killing the decode host mid-handoff: clean 503, prefill host healthy",
        () => midHandoff(() => decode.kill()),
      );

      await t.step(
        "cutting the decode host's link mid-handoff: 503 within the deadline",
        async () => {
          await decode.start();
          try {
            await midHandoff(() => lab.link("decode", false));
          } finally {
            await lab.link("decode", true);
          }
        },
      );
      await prefill.kill();
      await decode.kill();
      await redis.kill();
    } finally {
      fast.native.free();
      await lab.destroy();
      await Deno.remove(dir, { recursive: true });
    }
  },
});
