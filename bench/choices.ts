// `deno run -A --config deno.dev.json bench/choices.ts [runs] [max_tokens] [prompt_tokens]`: the
// cost of several choices of one prompt over HTTP (in process): POST /v1/completions on
// tiny-powerful with a 512-token prompt, max_tokens 64, temperature 0.7, n=4 against n=1,
// alternating runs (each pair after one warm-up of each). The n=4 request prefills once and forks
// the prompt's KV into the other three choices, which then decode in the same batched steps (the
// prefix cache is off: each request prefills). Prints each run's wall time, the scheduler's
// counters of one request of each, and the median ratio.
import { parseConfig } from "../lib/config/mod.ts";
import { createRuntime } from "../lib/serve/mod.ts";
import { createGenerateApp } from "../functions/generate/app.ts";

const runs = Number(Deno.args[0] ?? 5);
const maxTokens = Number(Deno.args[1] ?? 64);
const promptTokens = Number(Deno.args[2] ?? 512);
const models = new URL("../models/", import.meta.url).pathname;
const config = parseConfig({
  tiers: {
    powerful: {
      model: `${models}tiny-powerful`,
      max_context: 1024,
      max_new_tokens: 128,
      concurrency: 4,
      queue_depth: 4,
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

async function once(n: number, seed: number): Promise<number> {
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
  if (r.status !== 200) throw new Error(JSON.stringify(body));
  const lens = body.choices.map((c: { text: string }) => c.text.length).join("/");
  console.log(
    `n=${n} ${ms.toFixed(0)} ms, completion_tokens ${body.usage.completion_tokens} (chars ${lens})`,
  );
  return ms;
}

const counters = () => ({ ...rt.tiers.get("powerful")!.batch!.scheduler.counters });
for (const n of [1, 4]) {
  const before = counters();
  await once(n, 0);
  const after = counters();
  console.log(
    `  n=${n}: engine steps ${after.steps - before.steps} (burst ${
      after.burstSteps - before.burstSteps
    }), decode tokens ${after.decodeTokens - before.decodeTokens}, prefill tokens ${
      after.prefillTokens - before.prefillTokens
    }`,
  );
}
const ratios: number[] = [];
const apart: number[] = [];
for (let i = 1; i <= runs; i++) {
  const one = await once(1, i);
  const four = await once(4, i);
  ratios.push(four / one);
  // The same four choices as four concurrent n=1 requests (four prefills, batched decodes).
  const t0 = performance.now();
  await Promise.all([0, 1, 2, 3].map((j) => once(1, i + j)));
  apart.push((performance.now() - t0) / one);
}
apart.sort((a, b) => a - b);
console.log(`4 concurrent n=1 / n=1: median ${apart[Math.floor(apart.length / 2)].toFixed(2)}×`);
ratios.sort((a, b) => a - b);
console.log(
  `n=4 / n=1 wall time: median ${ratios[Math.floor(ratios.length / 2)].toFixed(2)}×, runs ${
    ratios.map((r) => r.toFixed(2)).join(" ")
  }`,
);
await rt.close();
