// Cold-start benchmark: spawns a real kvrelay process (the deno binary directly, as the images
// do) and measures process start → listening (/healthz) → ready (/readyz 200) → first token of
// each tier, and where the time went (from /readyz's `startup` report: runtime start, module
// loading, per-tier checkpoint/tokenizer/weights load, projectors). Cases: the bundled config
// (all functions, three demo tiers) and a random-weight bf16 checkpoint with the real Qwen3-0.6B
// config (scripts/make_checkpoint.ts; made on first use, never committed). Each case runs idle
// and under load (two busy processes competing for the CPUs). Medians of RUNS starts.
import { median } from "./machine.ts";
import { ensureShapeCheckpoint } from "../scripts/make_checkpoint.ts";

const root = new URL("../", import.meta.url).pathname;
const RUNS = 3;
const PROMPT = "The ship sailed out of the harbour at dawn";

/** One start of one case. */
export interface ColdStartRun {
  /** spawn → /healthz answers (ms). */
  listenMs: number;
  /** spawn → /readyz 200 (ms). */
  readyMs: number;
  /** spawn → first token of the first request (default tier, max_tokens 1). */
  firstTokenMs: number;
  /** Resident memory of the server after the first requests (MiB, /proc/PID/status): total,
   *  anonymous (heap: packed weights, KV) and file-backed (mapped files, the runtime). */
  rss: { totalMiB: number; anonMiB: number; fileMiB: number };
  /** Per tier: latency of its first request (ms, after ready, one at a time). */
  tierFirstTokenMs: Record<string, number>;
  /** Inside the process (ms): runtime start (spawn → time origin), then since the origin. */
  phases: {
    runtimeStart: number;
    modules: number;
    listening: number;
    tiers: Record<string, { checkpoint: number; tokenizer: number; weights: number }>;
    projectors: number;
    ready: number;
  };
}

/** A case's runs and medians. */
export interface ColdStartCase {
  name: string;
  load: "idle" | "loaded";
  runs: ColdStartRun[];
  median: { listenMs: number; readyMs: number; firstTokenMs: number; rssMiB: number };
}

/** What benchColdStart returns. */
export interface ColdStartResult {
  runs: number;
  /** /proc/loadavg (1, 5, 15 min) before the first start and after the last one. */
  loadAvg: { before: number[]; after: number[] };
  cases: ColdStartCase[];
}

async function loadAvg(): Promise<number[]> {
  const text = await Deno.readTextFile("/proc/loadavg").catch(() => "");
  return text.split(" ").slice(0, 3).map(Number);
}

async function poll(
  url: string,
  until: (status: number) => boolean,
  deadline: number,
  alive: () => boolean,
) {
  while (performance.now() < deadline && alive()) {
    try {
      const res = await fetch(url);
      const body = await res.text();
      if (until(res.status)) return { status: res.status, body };
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error(`${url}: no answer in time`);
}

async function startOnce(entry: string, config: string, tiers: string[]): Promise<ColdStartRun> {
  const port = 20000 + Math.floor(Math.random() * 20000);
  const base = `http://127.0.0.1:${port}`;
  const spawnEpoch = performance.timeOrigin + performance.now();
  const t0 = performance.now();
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${root}${entry}`],
    env: { PORT: String(port), HOST: "127.0.0.1", KVRELAY_CONFIG: config },
    stdout: "null",
    stderr: "piped",
  }).spawn();
  // Keep the server's log: when it exits early, the error says why.
  const log = new Response(child.stderr).text();
  let running = true;
  const exited = child.status.then((s) => {
    running = false;
    return s;
  });
  const alive = () => running;
  try {
    const deadline = t0 + 120_000;
    await poll(`${base}/healthz`, (s) => s === 200, deadline, alive);
    const listenMs = performance.now() - t0;
    const ready = await poll(`${base}/readyz`, (s) => s === 200, deadline, alive);
    const readyMs = performance.now() - t0;
    const tierFirstTokenMs: Record<string, number> = {};
    let firstTokenMs = 0;
    for (const tier of tiers) {
      const r0 = performance.now();
      const res = await fetch(`${base}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: tier, prompt: PROMPT, max_tokens: 1 }),
      });
      await res.text();
      if (res.status !== 200) throw new Error(`first request on ${tier}: ${res.status}`);
      tierFirstTokenMs[tier] = performance.now() - r0;
      if (firstTokenMs === 0) firstTokenMs = performance.now() - t0;
    }
    const s = JSON.parse(ready.body).startup;
    return {
      listenMs,
      readyMs,
      firstTokenMs,
      rss: await residentMiB(child.pid),
      tierFirstTokenMs,
      phases: {
        runtimeStart: s.timeOriginEpochMs - spawnEpoch,
        modules: s.modulesMs,
        listening: s.listeningMs,
        tiers: Object.fromEntries(
          Object.entries(s.tiers).map(([n, t]) => [n, (t as { loadMs: never }).loadMs]),
        ),
        projectors: s.projectorsMs,
        ready: s.readyMs,
      },
    };
  } catch (e) {
    const early = await Promise.race([exited, new Promise((r) => setTimeout(r, 50, null))]);
    if (early === null) throw e;
    throw new Error(`${entry} exited (${JSON.stringify(early)}) before answering: ${await log}`);
  } finally {
    try {
      child.kill("SIGKILL");
    } catch {
      // already exited
    }
    await child.status;
    await log;
  }
}

/** VmRSS / RssAnon / RssFile of a process, MiB. */
async function residentMiB(pid: number) {
  const status = await Deno.readTextFile(`/proc/${pid}/status`);
  const kib = (key: string) =>
    Number(new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? NaN);
  return {
    totalMiB: kib("VmRSS") / 1024,
    anonMiB: kib("RssAnon") / 1024,
    fileMiB: kib("RssFile") / 1024,
  };
}

/** Two busy processes (the "loaded" condition); returns a stop function. */
function cpuLoad(): () => Promise<void> {
  const kids = [0, 1].map(() =>
    new Deno.Command(Deno.execPath(), {
      args: ["eval", "let x = 0; for (;;) { x = (x * 1103515245 + 12345) | 0; }"],
      stdout: "null",
      stderr: "null",
    }).spawn()
  );
  return async () => {
    for (const k of kids) k.kill("SIGKILL");
    for (const k of kids) await k.status;
  };
}

/**
 * Runs the cold-start cases idle and loaded.
 * @returns runs and medians per case
 */
export async function benchColdStart(): Promise<ColdStartResult> {
  const qwenDir = await ensureShapeCheckpoint("qwen3-0.6b", { log: console.log });
  const tmp = await Deno.makeTempDir({ prefix: "kvrelay-coldstart-" });
  const qwenConfig = `${tmp}/qwen.json`;
  await Deno.writeTextFile(
    qwenConfig,
    JSON.stringify({
      tiers: {
        // bf16 KV: one 2,048-token sequence needs 224 MiB (28 layers x 8 KV heads x 128 x 2 x 2 B
        // per token); the pool is allocated lazily, so its size costs no start-up time.
        qwen: {
          model: qwenDir,
          backend: "cpu",
          max_context: 2048,
          kv_dtype: "bf16",
          kv_pool_mb: 256,
        },
      },
    }),
  );
  const cases = [
    {
      name: "bundled config (all functions, 3 tiers)",
      entry: "functions/main.ts",
      config: `${root}config/local.json`,
      tiers: ["fast", "balanced", "powerful"],
    },
    {
      name: "qwen3-0.6b bf16 (generate, 1 tier)",
      entry: "functions/generate/main.ts",
      config: qwenConfig,
      tiers: ["qwen"],
    },
  ];
  const out: ColdStartCase[] = [];
  const before = await loadAvg();
  try {
    for (const load of ["idle", "loaded"] as const) {
      for (const c of cases) {
        const stop = load === "loaded" ? cpuLoad() : null;
        const runs: ColdStartRun[] = [];
        try {
          for (let i = 0; i < RUNS; i++) runs.push(await startOnce(c.entry, c.config, c.tiers));
        } finally {
          await stop?.();
        }
        out.push({
          name: c.name,
          load,
          runs,
          median: {
            listenMs: median(runs.map((r) => r.listenMs)),
            readyMs: median(runs.map((r) => r.readyMs)),
            firstTokenMs: median(runs.map((r) => r.firstTokenMs)),
            rssMiB: median(runs.map((r) => r.rss.totalMiB)),
          },
        });
      }
    }
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
  return { runs: RUNS, loadAvg: { before, after: await loadAvg() }, cases: out };
}

const f = (x: number) => x.toFixed(0).padStart(6);

/**
 * Formats the cold-start table: medians, then the phase breakdown of the median-ready run.
 * @param r the result
 * @returns the table text
 */
export function formatColdStartTable(r: ColdStartResult): string {
  const lines = [
    `process start → listening → ready → first token, ms (median of ${r.runs}); load average ${
      r.loadAvg.before.join(" ")
    } before, ${r.loadAvg.after.join(" ")} after`,
    "case                                        load     listen  ready  first  rss MiB",
  ];
  for (const c of r.cases) {
    lines.push(
      `${c.name.padEnd(43)} ${c.load.padEnd(7)} ${f(c.median.listenMs)} ${f(c.median.readyMs)} ${
        f(c.median.firstTokenMs)
      } ${f(c.median.rssMiB)}`,
    );
  }
  lines.push("", "where the time went (run with the median ready time), ms:");
  for (const c of r.cases) {
    const run = [...c.runs].sort((a, b) => a.readyMs - b.readyMs)[c.runs.length >> 1];
    const p = run.phases;
    const tiers = Object.entries(p.tiers).map(([n, t]) =>
      `${n} ckpt ${t.checkpoint.toFixed(0)} tok ${t.tokenizer.toFixed(0)} weights ${
        t.weights.toFixed(0)
      }`
    ).join("; ");
    const ttft = Object.entries(run.tierFirstTokenMs).map(([n, v]) => `${n} ${v.toFixed(0)}`)
      .join(", ");
    lines.push(
      `${c.name} [${c.load}]: runtime start ${p.runtimeStart.toFixed(0)}, modules → ${
        p.modules.toFixed(0)
      }, listening → ${p.listening.toFixed(0)}, tiers (concurrent): ${tiers}; projectors ${
        p.projectors.toFixed(0)
      }; ready → ${p.ready.toFixed(0)}; first request per tier: ${ttft}; resident ${
        run.rss.totalMiB.toFixed(0)
      } MiB (anon ${run.rss.anonMiB.toFixed(0)}, file ${run.rss.fileMiB.toFixed(0)})`,
    );
  }
  return lines.join("\n");
}
