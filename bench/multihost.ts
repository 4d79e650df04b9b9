// Cross-host handoff benchmark: a prefill host (tiny-fast, one tier per snapshot encoding) and a
// decode host (tiny-fast + tiny-powerful + the fast→powerful projector) in their own network
// namespaces on a wire with 2 ms RTT and 1 Gbit/s per sender (tests/support/netns.ts). For a
// 2,048-token prompt it measures, at the client, time to the first token of
//   full:  a full prefill on the target (decode) host (POST /v1/completions, powerful),
//   warm:  prefill host with the prompt in its prefix cache → snapshot streamed to the decode host
//          → import, project, repair, first token (POST /v1/prefill forward_to),
//   cold:  the same without the prefix cache (the source prefill included),
// per encoding, with the snapshot bytes that crossed the wire. Medians of RUNS. Needs root (a
// skipped section says why).
import { median } from "./machine.ts";
import { readValidSample } from "../tests/support/corpus.ts";
import { HostedFunction } from "../tests/support/lab_hosts.ts";
import { NetLab, netLabUnavailable } from "../tests/support/netns.ts";
import { loadModel } from "../lib/engine/mod.ts";

const root = new URL("../", import.meta.url).pathname;
const RUNS = 5;
const TOKENS = 2048;
const ENCODINGS = ["native", "bf16", "f16", "q8"] as const;

/** One encoding's figures. */
export interface EncodingRow {
  encoding: string;
  snapshotBytes: number;
  warmTtftMs: number;
  coldTtftMs: number;
  warmSpeedup: number;
  /** Greedy first token equal to the f32 ("native") handoff's. */
  sameFirstToken: boolean;
}

/** What benchMultihost returns. */
export interface MultihostResult {
  skipped?: string;
  promptTokens?: number;
  wire?: string;
  fullPrefillTtftMs?: number;
  rows?: EncodingRow[];
}

const post = (url: string, body: unknown) =>
  fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });

// deno-lint-ignore no-explicit-any
async function timed(f: () => Promise<Response>): Promise<{ ms: number; body: any }> {
  const t0 = performance.now();
  const res = await f();
  const body = await res.json();
  const ms = performance.now() - t0;
  if (res.status !== 200) throw new Error(`${res.status}: ${JSON.stringify(body)}`);
  return { ms, body };
}

async function bytesOut(base: string): Promise<number> {
  const m = await (await fetch(`${base}/metrics`)).text();
  const line = m.split("\n").find((l) =>
    l.startsWith('kvrelay_snapshot_bytes_total{direction="out"}')
  );
  return line ? Number(line.split(" ").pop()) : 0;
}

/**
 * Runs the cross-host TTFT comparison.
 * @returns the figures, or `skipped` with the reason
 */
export async function benchMultihost(): Promise<MultihostResult> {
  const why = netLabUnavailable();
  if (why) return { skipped: why };
  const fast = await loadModel(`${root}models/tiny-fast`, { threads: 1 });
  const ids = fast.tokenizer.encode(await readValidSample()).slice(0, TOKENS);
  fast.native.free();
  const dir = await Deno.makeTempDir({ prefix: "kvrelay-multihost-bench-" });
  const lab = await NetLab.create(["prefill", "decode"], { delayMs: 1, rateMbit: 1000 });
  try {
    const tier = (model: string, extra: Record<string, unknown> = {}) => ({
      model: `${root}models/${model}`,
      threads: 0,
      max_context: 4096,
      max_new_tokens: 64,
      ...extra,
    });
    const prefillTiers: Record<string, unknown> = {};
    for (const e of ENCODINGS) {
      prefillTiers[`fast_${e}`] = tier("tiny-fast", { snapshot_encoding: e });
    }
    await Deno.writeTextFile(
      `${dir}/prefill.json`,
      JSON.stringify({
        tiers: prefillTiers,
        prefix_cache: { enabled: true, chunk_tokens: 64 },
        store: { kind: "memory", max_bytes: 1 << 30 },
        peers: { decoder: `http://${lab.host("decode").addr}:8080` },
      }),
    );
    await Deno.writeTextFile(
      `${dir}/decode.json`,
      JSON.stringify({
        tiers: { fast: tier("tiny-fast"), powerful: tier("tiny-powerful") },
        projectors: [{
          from: "fast",
          to: "powerful",
          path: `${root}models/projectors/tiny-fast--tiny-powerful`,
          min_quality: 0.5,
        }],
        // Every full prefill is a real one.
        prefix_cache: { enabled: false },
      }),
    );
    const prefill = new HostedFunction(lab, "prefill", "functions/prefill/main.ts", {
      KVRELAY_CONFIG: `${dir}/prefill.json`,
    });
    const decode = new HostedFunction(lab, "decode", "functions/main.ts", {
      KVRELAY_CONFIG: `${dir}/decode.json`,
    });
    await Promise.all([prefill.start(), decode.start()]);
    const full: number[] = [];
    for (let i = 0; i < RUNS + 1; i++) {
      const r = await timed(() =>
        post(`${decode.base}/v1/completions`, { model: "powerful", prompt: ids, max_tokens: 1 })
      );
      if (i > 0) full.push(r.ms); // the first run warms the process
    }
    const fullMs = median(full);
    const rows: EncodingRow[] = [];
    let reference: string | null = null;
    for (const e of ENCODINGS) {
      const handoff = (prompt: number[]) =>
        timed(() =>
          post(`${prefill.base}/v1/prefill`, {
            tier: `fast_${e}`,
            tokens: prompt,
            forward_to: "decoder",
            decode: { tier: "powerful", max_tokens: 1 },
          })
        );
      const warm: number[] = [];
      const cold: number[] = [];
      let bytes = 0;
      let text = "";
      // Prime the prefix cache with this prompt (all but its last token are cached chunks).
      await handoff(ids);
      for (let i = 0; i < RUNS; i++) {
        const b0 = await bytesOut(prefill.base);
        const r = await handoff(ids);
        bytes = (await bytesOut(prefill.base)) - b0;
        warm.push(r.ms);
        text = r.body.text;
        // Cold: a prompt the cache has never seen (same length: the first token differs).
        const fresh = [...ids];
        fresh[0] = (fresh[0] + 1 + i + ENCODINGS.indexOf(e) * RUNS) % 4000;
        cold.push((await handoff(fresh)).ms);
      }
      reference ??= text;
      const warmMs = median(warm);
      rows.push({
        encoding: e === "native" ? "f32 (native)" : e,
        snapshotBytes: bytes,
        warmTtftMs: warmMs,
        coldTtftMs: median(cold),
        warmSpeedup: fullMs / warmMs,
        sameFirstToken: text === reference,
      });
    }
    await prefill.kill();
    await decode.kill();
    return {
      promptTokens: ids.length,
      wire: "2 ms RTT, 1 Gbit/s per sender (userspace TUN wire)",
      fullPrefillTtftMs: fullMs,
      rows,
    };
  } finally {
    await lab.destroy();
    await Deno.remove(dir, { recursive: true });
  }
}

/**
 * Formats the cross-host table.
 * @param r the result
 * @returns table text
 */
export function formatMultihostTable(r: MultihostResult): string {
  if (r.skipped) return `skipped: ${r.skipped}`;
  const lines = [
    `fast → powerful across hosts (${r.wire}), ${r.promptTokens}-token prompt, TTFT ms (median of ${RUNS})`,
    `full prefill on the target host: ${r.fullPrefillTtftMs!.toFixed(1)} ms`,
    "encoding       snapshot MiB  warm TTFT  speedup  cold TTFT  same 1st token",
  ];
  for (const x of r.rows!) {
    lines.push(
      `${x.encoding.padEnd(14)} ${(x.snapshotBytes / 2 ** 20).toFixed(2).padStart(12)} ${
        x.warmTtftMs.toFixed(1).padStart(10)
      } ${x.warmSpeedup.toFixed(1).padStart(7)}× ${x.coldTtftMs.toFixed(1).padStart(10)} ${
        String(x.sameFirstToken).padStart(15)
      }`,
    );
  }
  return lines.join("\n");
}
