// `deno run -A --config deno.dev.json bench/choices.ts [runs] [max_tokens] [prompt_tokens] [decode_burst_ms]`: the
// cost of several choices of one prompt over HTTP (in process): POST /v1/completions on
// tiny-powerful with a 512-token prompt, max_tokens 64, temperature 0.7, n=4 against n=1,
// alternating runs (after one warm-up of each). The n=4 request prefills once and its other three
// choices adopt the prompt's KV blocks, then all four decode in the same batched steps (the prefix
// cache is off: each request prefills). Prints each run's wall and CPU time (the machine may be
// shared: CPU time is what the request cost), its engine steps (those in bursts), rows per step
// and wall time inside the steps, then medians and the n=4/n=1 ratios with their range.
import { parseConfig } from "../lib/config/mod.ts";
import { createRuntime } from "../lib/serve/mod.ts";
import { createGenerateApp } from "../functions/generate/app.ts";

const runs = Number(Deno.args[0] ?? 5);
const maxTokens = Number(Deno.args[1] ?? 64);
const promptTokens = Number(Deno.args[2] ?? 512);
// The tier's decode_burst_ms (its default unless given): how long one burst of decode steps lasts.
const burstMs = Deno.args[3] === undefined ? undefined : Number(Deno.args[3]);
const models = new URL("../models/", import.meta.url).pathname;
const config = parseConfig({
  tiers: {
    powerful: {
      model: `${models}tiny-powerful`,
      max_context: 1024,
      max_new_tokens: 128,
      concurrency: 4,
      queue_depth: 4,
      ...(burstMs === undefined ? {} : { decode_burst_ms: burstMs }),
    },
  },
  // Every request prefills its whole prompt: the prefix cache would serve repeats of it.
  prefix_cache: { enabled: false },
}, { env: () => undefined, baseDir: models });
const rt = await createRuntime(config);
await rt.load();
const app = createGenerateApp(rt);
const tok = rt.tiers.get("powerful")!.model.tokenizer;
const words = "the relay keeps every cache warm while the lighthouse keeper counts ships ";
const prompt = tok.encode(words.repeat(64)).slice(0, promptTokens);

/** CPU seconds of this process (user + system, all threads; Linux /proc/self/stat): the machine
 * may be shared, and CPU time is what the request itself cost. */
function cpuSeconds(): number {
  const stat = Deno.readTextFileSync("/proc/self/stat");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
}

const counters = () => ({ ...rt.tiers.get("powerful")!.batch!.scheduler.counters });

/** One run's cost: wall and CPU ms, engine steps (in bursts), rows per step, ms inside them. */
interface Run {
  ms: number;
  cpuMs: number;
  steps: number;
  burstSteps: number;
  rows: number;
  engineMs: number;
}

async function once(n: number, seed: number, log = true): Promise<Run> {
  const before = counters();
  const c0 = cpuSeconds();
  const t0 = performance.now();
  const r = await app.request("/v1/completions", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "powerful",
      prompt,
      n,
      max_tokens: maxTokens,
      temperature: 0.7,
      seed,
    }),
  });
  const body = await r.json();
  const ms = performance.now() - t0;
  const cpuMs = (cpuSeconds() - c0) * 1000;
  const after = counters();
  if (r.status !== 200) throw new Error(JSON.stringify(body));
  const run = {
    ms,
    cpuMs,
    steps: after.steps - before.steps,
    burstSteps: after.burstSteps - before.burstSteps,
    rows: after.rows - before.rows,
    engineMs: after.engineMs - before.engineMs,
  };
  if (log) {
    const lens = body.choices.map((c: { text: string }) => c.text.length).join("/");
    console.log(
      `n=${n} ${ms.toFixed(0)} ms (CPU ${
        cpuMs.toFixed(0)
      } ms), ${run.steps} steps (${run.burstSteps} in bursts), ${
        (run.rows / run.steps).toFixed(2)
      } rows/step, ${
        run.engineMs.toFixed(0)
      } ms in steps, completion_tokens ${body.usage.completion_tokens} (chars ${lens})`,
    );
  }
  return run;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const spread = (xs: number[]) =>
  `median ${median(xs).toFixed(2)}×, range ${Math.min(...xs).toFixed(2)}–${
    Math.max(...xs).toFixed(2)
  }`;
await once(1, 0);
await once(4, 0);
const ones: Run[] = [], fours: Run[] = [];
const apart: number[] = [];
for (let i = 1; i <= runs; i++) {
  // Alternating which goes first, so a load change hits both alike.
  const one = i % 2 ? await once(1, i) : undefined;
  const four = await once(4, i);
  ones.push(one ?? await once(1, i));
  fours.push(four);
  // The same four choices as four concurrent n=1 requests (four prefills, batched decodes).
  const t0 = performance.now();
  await Promise.all([0, 1, 2, 3].map((j) => once(1, i + j, false)));
  apart.push((performance.now() - t0) / ones[i - 1].ms);
}
const ratio = (f: (r: Run) => number) => spread(fours.map((r, i) => f(r) / f(ones[i])));
console.log(`4 concurrent n=1 / n=1 wall time: ${spread(apart)}`);
for (const [name, rs] of [["n=1", ones], ["n=4", fours]] as const) {
  console.log(
    `${name} medians: wall ${median(rs.map((r) => r.ms)).toFixed(0)} ms, CPU ${
      median(rs.map((r) => r.cpuMs)).toFixed(0)
    } ms, steps ${median(rs.map((r) => r.steps))} (bursts ${
      median(rs.map((r) => r.burstSteps))
    }), in steps ${median(rs.map((r) => r.engineMs)).toFixed(0)} ms, outside them ${
      median(rs.map((r) => r.ms - r.engineMs)).toFixed(1)
    } ms`,
  );
}
console.log(`n=4 / n=1 CPU time: ${ratio((r) => r.cpuMs)}`);
console.log(`n=4 / n=1 wall time: ${ratio((r) => r.ms)}`);
await rt.close();
