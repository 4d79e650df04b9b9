// HTTP-layer benchmark: a bounded loopback load on the demo tiers through the real generate app
// (Deno.serve on 127.0.0.1, streamed /v1/completions), reporting p50/p99 TTFT, per-request
// tokens/s, p50/p99 time per output token and aggregate tokens/s at concurrency 1, 8 and 32,
// error counts by status, the per-request overhead of the HTTP layer vs calling lib/engine
// generate() directly, and handoff concurrency: a prefill on fast kept in the store then a decode
// on powerful migrated through the demo projector, one at a time vs 32 at once, beside 32 direct
// completions on powerful, and probe latency: /healthz and /metrics p50/p99 while 32 streams
// generate on every tier at once. Tiers use the bundled config's admission (concurrency,
// queue_depth) and continuous batching, 2 threads each. Then prefix sharing (bench/prefix_share.ts):
// TTFT of a request sharing a 1,024-token prefix with a finished one on tiny-powerful, against the
// first's. Bounded: ~2–3 min on 2 cores.
import { parseConfig } from "../lib/config/mod.ts";
import { generate } from "../lib/engine/mod.ts";
import { createBaseApp } from "../functions/shared/mod.ts";
import { registerDecode } from "../functions/decode/app.ts";
import { registerGenerate } from "../functions/generate/app.ts";
import { registerPrefill } from "../functions/prefill/app.ts";
import { createRuntime } from "../lib/serve/mod.ts";
import { formatPrefixSharing, prefixSharing, type PrefixSharingResult } from "./prefix_share.ts";

const root = new URL("../", import.meta.url).pathname;
const TIERS: Record<string, string> = {
  fast: "tiny-fast",
  balanced: "tiny-balanced",
  powerful: "tiny-powerful",
};
const CONCURRENCY = [1, 8, 32];
const MAX_TOKENS = 32;
const THREADS = 2;
const PROMPTS = [
  "It was the best of times, it was the worst of times, it was the age of wisdom",
  "Call me Ishmael. Some years ago, never mind how long precisely",
  "The ship sailed out of the harbour at dawn, and the sea was calm",
  "Once upon a time there lived a king who had three daughters",
];

/** Latency/throughput at one concurrency level. */
export interface LoadPoint {
  concurrency: number;
  requests: number;
  ok: number;
  /** Non-200 responses by status (and "network" for failed fetches). */
  errors: Record<string, number>;
  ttftMs: { p50: number; p99: number };
  /** Time between streamed tokens, ms (every interval of every request). */
  tpotMs: { p50: number; p99: number };
  /** Per-request decode rate after the first token, tokens/s. */
  tokensPerSecond: { p50: number; p99: number };
  /** All generated tokens / wall time, tokens/s. */
  aggregateTokensPerSecond: number;
  wallS: number;
}

/** Tokens/s of one way of generating at one concurrency (greedy, non-streamed). */
export interface HandoffPoint {
  /** "handoff": /v1/prefill fast (store) then /v1/decode powerful (migrated); "direct":
   *  /v1/completions on powerful */
  path: "handoff" | "direct";
  concurrency: number;
  requests: number;
  ok: number;
  errors: Record<string, number>;
  /** Completion tokens / wall time of the whole requests (a handoff's prefill included). */
  aggregateTokensPerSecond: number;
  wallS: number;
}

/** Handoff concurrency (see the file comment). */
export interface HandoffBenchResult {
  maxTokens: number;
  points: HandoffPoint[];
  /** 32 concurrent handoffs / one at a time */
  concurrentVsAlone: number;
  /** 32 concurrent handoffs / 32 concurrent direct completions on powerful */
  handoffVsDirect: number;
}

/** Latency of one probe path while the load ran. */
export interface ProbePath {
  path: string;
  requests: number;
  /** non-200 answers and failed fetches */
  errors: number;
  ms: { p50: number; p99: number; max: number };
}

/** Probe latency under load (see the file comment). */
export interface ProbeBenchResult {
  /** streams per tier, all tiers at once */
  streamsPerTier: number;
  maxTokens: number;
  /** streams that ended 200, of all */
  streamsOk: number;
  streams: number;
  /** stream failures by status */
  streamErrors: Record<string, number>;
  probes: ProbePath[];
}

/** What benchHttp returns. */
export interface HttpBenchResult {
  maxTokens: number;
  tiers: Record<string, LoadPoint[]>;
  handoff: HandoffBenchResult;
  probes: ProbeBenchResult;
  /** Same request through HTTP (non-streamed, loopback) vs engine generate(), fast tier, c=1. */
  overhead: { requests: number; engineMsP50: number; httpMsP50: number; overheadMsP50: number };
  /** A second request sharing a 1,024-token prefix with a finished one (prefix cache on). */
  prefixSharing: PrefixSharingResult;
}

function quantile(xs: number[], q: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const i = Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1));
  return Math.round(s[i] * 100) / 100;
}

async function streamOne(base: string, tier: string, prompt: string, maxTokens = MAX_TOKENS) {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: tier,
      prompt,
      max_tokens: maxTokens,
      stream: true,
      stream_options: { include_usage: true },
    }),
  });
  if (res.status !== 200) {
    await res.body?.cancel();
    return { status: String(res.status) };
  }
  let first: number | undefined;
  let tokens = 0;
  const stamps: number[] = [];
  const dec = new TextDecoder();
  let buf = "";
  for await (const chunk of res.body!) {
    first ??= performance.now();
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!frame.startsWith("data: ") || frame === "data: [DONE]") continue;
      const obj = JSON.parse(frame.slice(6));
      if (obj.error) return { status: "stream_error" };
      if (obj.usage) tokens = obj.usage.completion_tokens;
      if (obj.choices?.[0]?.text) stamps.push(performance.now());
    }
  }
  const end = performance.now();
  return {
    status: "200",
    ttftMs: (first ?? end) - t0,
    tokens,
    decodeS: (end - (first ?? end)) / 1000,
    tpot: stamps.slice(1).map((t, i) => t - stamps[i]),
  };
}

async function loadPoint(base: string, tier: string, concurrency: number): Promise<LoadPoint> {
  const requests = Math.max(8, concurrency * 2);
  let next = 0;
  const ttft: number[] = [];
  const tps: number[] = [];
  const tpot: number[] = [];
  const errors: Record<string, number> = {};
  let ok = 0;
  let totalTokens = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < requests) {
      const i = next++;
      try {
        const r = await streamOne(base, tier, PROMPTS[i % PROMPTS.length]);
        if (r.status !== "200") {
          errors[r.status] = (errors[r.status] ?? 0) + 1;
          continue;
        }
        ok++;
        ttft.push(r.ttftMs!);
        tpot.push(...r.tpot!);
        totalTokens += r.tokens!;
        if (r.tokens! > 1 && r.decodeS! > 0) tps.push((r.tokens! - 1) / r.decodeS!);
      } catch {
        errors.network = (errors.network ?? 0) + 1;
      }
    }
  }));
  const wallS = (performance.now() - t0) / 1000;
  return {
    concurrency,
    requests,
    ok,
    errors,
    ttftMs: { p50: quantile(ttft, 0.5), p99: quantile(ttft, 0.99) },
    tpotMs: { p50: quantile(tpot, 0.5), p99: quantile(tpot, 0.99) },
    tokensPerSecond: { p50: quantile(tps, 0.5), p99: quantile(tps, 0.99) },
    aggregateTokensPerSecond: Math.round((totalTokens / wallS) * 10) / 10,
    wallS: Math.round(wallS * 100) / 100,
  };
}

const HANDOFF_TOKENS = 64;

async function postJson(base: string, path: string, body: unknown): Promise<Response> {
  return await fetch(`${base}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
}

/** One handoff (or one direct completion): its completion tokens, or the failing status. */
async function handoffOne(
  base: string,
  path: HandoffPoint["path"],
  prompt: string,
): Promise<{ status: string; tokens: number }> {
  const sampling = { max_tokens: HANDOFF_TOKENS, temperature: 0, ignore_eos: true };
  if (path === "direct") {
    const res = await postJson(base, "/v1/completions", { model: "powerful", prompt, ...sampling });
    if (res.status !== 200) {
      return (await res.body?.cancel(), { status: String(res.status), tokens: 0 });
    }
    return { status: "200", tokens: (await res.json()).usage.completion_tokens };
  }
  const pre = await postJson(base, "/v1/prefill", { tier: "fast", prompt, store: true });
  if (pre.status !== 200) {
    return (await pre.body?.cancel(), { status: `prefill ${pre.status}`, tokens: 0 });
  }
  const { snapshot_id } = await pre.json();
  const res = await postJson(base, "/v1/decode", { snapshot_id, tier: "powerful", ...sampling });
  if (res.status !== 200) {
    return (await res.body?.cancel(), { status: `decode ${res.status}`, tokens: 0 });
  }
  const body = await res.json();
  if (!body.migrated) return { status: "not migrated", tokens: 0 };
  return { status: "200", tokens: body.usage.completion_tokens };
}

async function handoffPoint(
  base: string,
  path: HandoffPoint["path"],
  concurrency: number,
  requests: number,
): Promise<HandoffPoint> {
  let next = 0, ok = 0, tokens = 0;
  const errors: Record<string, number> = {};
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < requests) {
      const i = next++;
      try {
        const r = await handoffOne(base, path, PROMPTS[i % PROMPTS.length]);
        if (r.status !== "200") errors[r.status] = (errors[r.status] ?? 0) + 1;
        else (ok++, tokens += r.tokens);
      } catch {
        errors.network = (errors.network ?? 0) + 1;
      }
    }
  }));
  const wallS = (performance.now() - t0) / 1000;
  return {
    path,
    concurrency,
    requests,
    ok,
    errors,
    aggregateTokensPerSecond: Math.round((tokens / wallS) * 10) / 10,
    wallS: Math.round(wallS * 100) / 100,
  };
}

/**
 * Handoff concurrency on a served app with the prefill, decode and generate routes.
 * @param base the server's address
 * @returns one handoff at a time (16 of them), 32 at once (64), 32 direct completions on
 *   powerful at once (64)
 */
export async function benchHandoffs(base: string): Promise<HandoffBenchResult> {
  await handoffPoint(base, "handoff", 1, 2); // warm-up: the projector's first use, the store
  const alone = await handoffPoint(base, "handoff", 1, 16);
  const together = await handoffPoint(base, "handoff", 32, 64);
  const direct = await handoffPoint(base, "direct", 32, 64);
  const ratio = (a: number, b: number) => Math.round((a / b) * 100) / 100;
  return {
    maxTokens: HANDOFF_TOKENS,
    points: [alone, together, direct],
    concurrentVsAlone: ratio(together.aggregateTokensPerSecond, alone.aggregateTokensPerSecond),
    handoffVsDirect: ratio(together.aggregateTokensPerSecond, direct.aggregateTokensPerSecond),
  };
}

const PROBE_STREAMS = 32;
const PROBE_TOKENS = 64;
const PROBE_PATHS = ["/healthz", "/metrics"];

/**
 * Probe latency under load: 32 streamed completions on every tier at once while one client
 * probes /healthz and /metrics in turn, back to back, until the last stream ends.
 * @param base the server's address
 * @param tiers the tiers to load
 * @returns per probe path its latency, and how the streams ended
 */
export async function benchProbes(base: string, tiers: string[]): Promise<ProbeBenchResult> {
  const streamErrors: Record<string, number> = {};
  let streamsOk = 0;
  let loading = true;
  const load = Promise.all(
    tiers.flatMap((tier) =>
      Array.from({ length: PROBE_STREAMS }, async (_, i) => {
        try {
          const r = await streamOne(base, tier, PROMPTS[i % PROMPTS.length], PROBE_TOKENS);
          if (r.status === "200") streamsOk++;
          else streamErrors[r.status] = (streamErrors[r.status] ?? 0) + 1;
        } catch {
          streamErrors.network = (streamErrors.network ?? 0) + 1;
        }
      })
    ),
  ).finally(() => loading = false);
  const ms: Record<string, number[]> = {};
  const errors: Record<string, number> = {};
  for (const p of PROBE_PATHS) (ms[p] = [], errors[p] = 0);
  for (let i = 0; loading; i++) {
    const path = PROBE_PATHS[i % PROBE_PATHS.length];
    const t = performance.now();
    try {
      const res = await fetch(`${base}${path}`);
      await res.arrayBuffer();
      if (res.status !== 200) errors[path]++;
      else ms[path].push(performance.now() - t);
    } catch {
      errors[path]++;
    }
  }
  await load;
  return {
    streamsPerTier: PROBE_STREAMS,
    maxTokens: PROBE_TOKENS,
    streamsOk,
    streams: PROBE_STREAMS * tiers.length,
    streamErrors,
    probes: PROBE_PATHS.map((path) => ({
      path,
      requests: ms[path].length + errors[path],
      errors: errors[path],
      ms: {
        p50: quantile(ms[path], 0.5),
        p99: quantile(ms[path], 0.99),
        max: quantile(ms[path], 1),
      },
    })),
  };
}

/**
 * Runs the HTTP benchmark over the demo tiers (prefix cache off, so every request prefills).
 * @returns the load points per tier and the HTTP overhead
 */
export async function benchHttp(): Promise<HttpBenchResult> {
  const bundled = JSON.parse(await Deno.readTextFile(`${root}config/local.json`)).tiers;
  const tiers: Record<string, unknown> = {};
  for (const [name, dir] of Object.entries(TIERS)) {
    tiers[name] = {
      model: `${root}models/${dir}`,
      threads: THREADS,
      concurrency: bundled[name].concurrency,
      queue_depth: bundled[name].queue_depth,
      max_context: 1024,
      max_new_tokens: 64,
    };
  }
  const projectors = [{
    from: "fast",
    to: "powerful",
    path: `${root}models/projectors/tiny-fast--tiny-powerful`,
    min_quality: 0.5,
  }];
  const config = parseConfig({ tiers, projectors, prefix_cache: { enabled: false } }, {
    env: () => undefined,
  });
  const rt = await createRuntime(config);
  await rt.load();
  const app = createBaseApp(rt, "bench");
  registerGenerate(app, rt);
  registerPrefill(app, rt);
  registerDecode(app, rt);
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen: () => {} }, app.fetch);
  const base = `http://127.0.0.1:${server.addr.port}`;
  let loaded: Omit<HttpBenchResult, "prefixSharing">;
  try {
    const out: Record<string, LoadPoint[]> = {};
    for (const tier of Object.keys(TIERS)) {
      out[tier] = [];
      for (const c of CONCURRENCY) out[tier].push(await loadPoint(base, tier, c));
    }
    // Overhead: identical greedy requests, alternating engine and HTTP, fast tier.
    const model = rt.tiers.get("fast")!.model;
    const engineMs: number[] = [];
    const httpMs: number[] = [];
    const n = 12;
    for (let i = 0; i < n; i++) {
      const prompt = PROMPTS[i % PROMPTS.length];
      let t = performance.now();
      await generate(model, prompt, { maxTokens: MAX_TOKENS, temperature: 0 });
      engineMs.push(performance.now() - t);
      t = performance.now();
      const res = await fetch(`${base}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "fast", prompt, max_tokens: MAX_TOKENS }),
      });
      await res.json();
      httpMs.push(performance.now() - t);
    }
    const e = quantile(engineMs, 0.5), h = quantile(httpMs, 0.5);
    loaded = {
      maxTokens: MAX_TOKENS,
      tiers: out,
      handoff: await benchHandoffs(base),
      probes: await benchProbes(base, Object.keys(TIERS)),
      overhead: {
        requests: n,
        engineMsP50: e,
        httpMsP50: h,
        overheadMsP50: Math.round((h - e) * 100) / 100,
      },
    };
  } finally {
    await server.shutdown();
    await rt.close();
  }
  // In a runtime of its own (prefix cache on), once the load points' runtime is closed.
  return { ...loaded, prefixSharing: await prefixSharing(5, 1024) };
}

/**
 * Formats a result as a text table.
 * @param r the result of benchHttp
 * @returns the table
 */
export function formatHttpTable(r: HttpBenchResult): string {
  const lines = [
    "tier      conc  ok/req  errors       ttft p50/p99 ms   tpot p50/p99 ms   tok/s p50/p99   agg tok/s",
  ];
  for (const [tier, points] of Object.entries(r.tiers)) {
    for (const p of points) {
      lines.push(
        `${tier.padEnd(9)} ${String(p.concurrency).padStart(4)}  ${
          `${p.ok}/${p.requests}`.padStart(6)
        }  ${JSON.stringify(p.errors).padEnd(11)}  ${
          `${p.ttftMs.p50}/${p.ttftMs.p99}`.padStart(16)
        }  ${`${p.tpotMs.p50}/${p.tpotMs.p99}`.padStart(16)}  ${
          `${p.tokensPerSecond.p50}/${p.tokensPerSecond.p99}`.padStart(14)
        }  ${String(p.aggregateTokensPerSecond).padStart(9)}`,
      );
    }
    const one = points.find((p) => p.concurrency === 1),
      many = points.find((p) => p.concurrency === 32);
    if (one && many) {
      lines.push(
        `${tier.padEnd(9)} c=32 vs c=1: aggregate ×${
          (many.aggregateTokensPerSecond / one.aggregateTokensPerSecond).toFixed(2)
        }, p99 TPOT ×${(many.tpotMs.p99 / one.tpotMs.p99).toFixed(2)}`,
      );
    }
  }
  const o = r.overhead;
  lines.push(
    `HTTP overhead (fast, c=1, ${o.requests} req): engine ${o.engineMsP50} ms, HTTP ${o.httpMsP50} ms, +${o.overheadMsP50} ms p50`,
  );
  const hd = r.handoff;
  lines.push(
    `handoffs (prefill fast, store → decode powerful, migrated; ${hd.maxTokens} tokens, greedy):`,
  );
  for (const p of hd.points) {
    lines.push(
      `  ${p.path.padEnd(8)} c=${String(p.concurrency).padEnd(3)} ${p.ok}/${p.requests} ${
        JSON.stringify(p.errors)
      }  ${p.aggregateTokensPerSecond} tok/s (${p.wallS} s)`,
    );
  }
  lines.push(
    `  32 handoffs vs one at a time ×${hd.concurrentVsAlone}; vs 32 direct completions ×${hd.handoffVsDirect}`,
  );
  lines.push(formatPrefixSharing(r.prefixSharing).split("\n").at(-1)!);
  const pr = r.probes;
  if (pr) {
    lines.push(
      `probes while ${pr.streamsPerTier} streams generate on every tier (${pr.maxTokens} tokens; streams ${pr.streamsOk}/${pr.streams} ok ${
        JSON.stringify(pr.streamErrors)
      }):`,
    );
    for (const p of pr.probes) {
      lines.push(
        `  ${
          p.path.padEnd(9)
        } ${p.requests} req, ${p.errors} errors  p50 ${p.ms.p50} ms  p99 ${p.ms.p99} ms  max ${p.ms.max} ms`,
      );
    }
  }
  return lines.join("\n");
}

if (import.meta.main) {
  const r = await benchHttp();
  console.log(formatHttpTable(r));
  console.log(JSON.stringify(r));
}
