// `deno run -A --config deno.dev.json bench/prefix_share.ts [runs] [prefix_tokens]`: time to first
// token of a request sharing a long prefix with a finished one, over HTTP (in process): streamed
// POST /v1/completions on tiny-powerful (greedy, max_tokens 8). Each run builds a fresh
// prefix_tokens-token prefix (default 1,024), sends it with one 16-token tail, waits for the answer,
// then sends it with another tail: the second request adopts the prefix's pool blocks (prefix
// cache inside the pool) and prefills only its tail. Prints each pair's TTFTs, the median ratio
// second/first, and the prefix-cache metrics (shared blocks, KV bytes copied for hits).
import { parseConfig } from "../lib/config/mod.ts";
import { createRuntime } from "../lib/serve/mod.ts";
import { createGenerateApp } from "../functions/generate/app.ts";

const runs = Number(Deno.args[0] ?? 5);
const prefixTokens = Number(Deno.args[1] ?? 1024);
const models = new URL("../models/", import.meta.url).pathname;
const config = parseConfig({
  tiers: {
    powerful: {
      model: `${models}tiny-powerful`,
      max_context: 2048,
      max_new_tokens: 64,
      concurrency: 4,
      queue_depth: 4,
    },
  },
}, { env: () => undefined, baseDir: models });
const rt = await createRuntime(config);
await rt.load();
const app = createGenerateApp(rt);
const vocab = rt.tiers.get("powerful")!.model.native.config.vocabSize;

/** Milliseconds from the request to its first streamed token. */
async function ttft(prompt: number[]): Promise<number> {
  const t0 = performance.now();
  const r = await app.request("/v1/completions", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "powerful",
      prompt,
      max_tokens: 8,
      temperature: 0,
      stream: true,
    }),
  });
  if (r.status !== 200) throw new Error(await r.text());
  const reader = r.body!.getReader();
  const dec = new TextDecoder();
  let first = NaN, text = "";
  while (true) {
    const { done, value } = await reader.read();
    if (done) break;
    text += dec.decode(value, { stream: true });
    if (Number.isNaN(first) && /"text":"[^"]/.test(text)) first = performance.now() - t0;
  }
  return first;
}

const ids = (n: number, seed: number) =>
  Array.from({ length: n }, (_, i) => 10 + ((i * 7919 + seed * 104729) % (vocab - 10)));
await ttft(ids(64, 999)); // warm-up
const ratios: number[] = [];
for (let i = 0; i < runs; i++) {
  const prefix = ids(prefixTokens, i + 1);
  const first = await ttft([...prefix, ...ids(16, 1000 + i)]);
  const second = await ttft([...prefix, ...ids(16, 2000 + i)]);
  ratios.push(second / first);
  console.log(
    `run ${i + 1}: first ${first.toFixed(1)} ms, second ${second.toFixed(1)} ms, ratio ${
      (second / first).toFixed(3)
    }`,
  );
}
const metrics = await (await app.request("/metrics")).text();
for (const line of metrics.split("\n")) {
  if (
    /^kvrelay_prefix_cache_(shared_blocks|copied_bytes|hits)_total\{tier="powerful"\}/.test(line)
  ) {
    console.log(line);
  }
}
ratios.sort((a, b) => a - b);
console.log(
  `second / first TTFT (${prefixTokens}-token shared prefix): median ${
    ratios[Math.floor(ratios.length / 2)].toFixed(3)
  }, runs ${ratios.map((r) => r.toFixed(3)).join(" ")}`,
);
await rt.close();
