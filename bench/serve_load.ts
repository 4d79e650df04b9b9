// `deno task bench serve`: decode throughput of the service as a client sees it. The README's
// server (functions/main.ts, the bundled config: its tiers, threads, admission and default
// sampling) runs as a process of its own; this process is the client. Per demo tier, 256-token
// completions (ignore_eos) one at a time and 32 at once: greedy non-streamed, greedy streamed, and
// with the model's default sampling (generation_config.json: temperature, top_p, repetition
// penalty). Aggregate tokens/s, medians over alternating rounds. The engine's own figure without
// HTTP is `bench batch`; the two run on the same cores, so compare them from one machine.

const root = new URL("../", import.meta.url).pathname;
const TIERS = ["fast", "balanced", "powerful"];
const MAX_TOKENS = 256;
const ROUNDS = 3;
const PROMPTS = [
  "It was the best of times, it was the worst of times, it was the age of wisdom",
  "Call me Ishmael. Some years ago, never mind how long precisely",
  "The ship sailed out of the harbour at dawn, and the sea was calm",
  "Once upon a time there lived a king who had three daughters",
];

/** One way of asking. */
interface Mode {
  name: string;
  concurrency: number;
  stream: boolean;
  /** the model's default sampling (else greedy) */
  sampled: boolean;
}

const MODES: Mode[] = [
  { name: "greedy", concurrency: 1, stream: false, sampled: false },
  { name: "greedy", concurrency: 32, stream: false, sampled: false },
  { name: "greedy streamed", concurrency: 32, stream: true, sampled: false },
  { name: "default sampling", concurrency: 1, stream: false, sampled: true },
  { name: "default sampling", concurrency: 32, stream: false, sampled: true },
];

/** Aggregate tokens/s of one tier and mode, per round. */
export interface ServeLoadPoint {
  tier: string;
  mode: string;
  concurrency: number;
  tokensPerSecond: number[];
  median: number;
}

/** What benchServeLoad returns. */
export interface ServeLoadResult {
  maxTokens: number;
  rounds: number;
  points: ServeLoadPoint[];
}

async function complete(base: string, tier: string, i: number, mode: Mode): Promise<number> {
  const body: Record<string, unknown> = {
    model: tier,
    prompt: `${PROMPTS[i % PROMPTS.length]} ${i}`,
    max_tokens: MAX_TOKENS,
    ignore_eos: true,
    stream: mode.stream,
  };
  if (!mode.sampled) body.temperature = 0;
  if (mode.stream) body.stream_options = { include_usage: true };
  const res = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  if (res.status !== 200) throw new Error(`${tier}: status ${res.status}: ${await res.text()}`);
  if (!mode.stream) return (await res.json()).usage.completion_tokens;
  const text = await res.text();
  const usage = text.split("\n").filter((l) => l.includes('"usage"')).at(-1);
  return usage ? JSON.parse(usage.slice(6)).usage.completion_tokens : 0;
}

async function measure(base: string, tier: string, mode: Mode): Promise<number> {
  const requests = mode.concurrency === 1 ? 4 : mode.concurrency;
  let next = 0, tokens = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: mode.concurrency }, async () => {
    while (next < requests) {
      const got = await complete(base, tier, next++, mode);
      tokens += got;
    }
  }));
  return Math.round(tokens / ((performance.now() - t0) / 1000));
}

async function waitReady(base: string, alive: () => boolean): Promise<void> {
  const deadline = performance.now() + 300_000;
  while (performance.now() < deadline && alive()) {
    try {
      const res = await fetch(`${base}/readyz`);
      await res.body?.cancel();
      if (res.status === 200) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("the server did not become ready");
}

/**
 * Runs the section (see the file comment).
 * @returns per tier and mode the tokens/s of each round and their median
 */
export async function benchServeLoad(): Promise<ServeLoadResult> {
  const port = 20000 + Math.floor(Math.random() * 20000);
  const base = `http://127.0.0.1:${port}`;
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${root}functions/main.ts`],
    env: { PORT: String(port), HOST: "127.0.0.1" },
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const log = new Response(child.stderr).text();
  let running = true;
  const exited = child.status.finally(() => running = false);
  const runs = new Map<string, number[]>();
  try {
    await waitReady(base, () => running);
    for (const tier of TIERS) await measure(base, tier, MODES[1]); // warm every tier
    for (let r = 0; r < ROUNDS; r++) {
      for (const tier of TIERS) {
        for (const mode of MODES) {
          const key = `${tier}\0${mode.name}\0${mode.concurrency}`;
          runs.set(key, [...runs.get(key) ?? [], await measure(base, tier, mode)]);
        }
      }
    }
  } catch (e) {
    if (!running) throw new Error(`the server exited: ${await log}`);
    throw e;
  } finally {
    if (running) child.kill("SIGTERM");
    await exited;
    await log;
  }
  const points: ServeLoadPoint[] = [];
  for (const [key, tps] of runs) {
    const [tier, mode, c] = key.split("\0");
    const sorted = [...tps].sort((a, b) => a - b);
    points.push({
      tier,
      mode,
      concurrency: Number(c),
      tokensPerSecond: tps,
      median: sorted[Math.floor(sorted.length / 2)],
    });
  }
  return { maxTokens: MAX_TOKENS, rounds: ROUNDS, points };
}

/**
 * Formats a result as a text table.
 * @param r the result of benchServeLoad
 * @returns the table
 */
export function formatServeLoadTable(r: ServeLoadResult): string {
  const lines = [
    `the README server, ${r.maxTokens}-token completions, tokens/s (median of ${r.rounds} alternating rounds)`,
    "tier      mode               conc   median  runs",
  ];
  for (const p of r.points) {
    lines.push(
      `${p.tier.padEnd(9)} ${p.mode.padEnd(18)} ${String(p.concurrency).padStart(4)}  ${
        String(p.median).padStart(7)
      }  ${p.tokensPerSecond.join(" ")}`,
    );
  }
  for (const tier of new Set(r.points.map((p) => p.tier))) {
    const at = (mode: string, c: number) =>
      r.points.find((p) => p.tier === tier && p.mode === mode && p.concurrency === c)?.median;
    const one = at("greedy", 1), many = at("greedy", 32), streamed = at("greedy streamed", 32);
    if (one && many && streamed) {
      lines.push(
        `${tier.padEnd(9)} 32 at once vs one at a time ×${
          (many / one).toFixed(2)
        }; streamed vs not ×${(streamed / many).toFixed(2)}`,
      );
    }
  }
  return lines.join("\n");
}
