// `deno run -A --config deno.dev.json bench/prefix_share.ts [runs] [prefix_tokens]`: time to first
// token of a request sharing a long prefix with a finished one, over HTTP (in process): streamed
// POST /v1/completions on tiny-powerful (greedy, max_tokens 8, prefix cache on). Each run builds a
// fresh prefix_tokens-token prefix (default 1,024), sends it with one 16-token tail, waits for the
// answer, then sends it with another tail: the second request adopts the prefix's pool blocks
// (prefix cache inside the pool) and prefills only its tail. The first request's time includes
// writing its chunks to the store (the second tier). Prints each pair's TTFTs, the median ratio
// second/first, and the prefix-cache metrics (shared blocks, KV bytes copied for hits). Also the
// "prefix sharing" part of `bench http` (bench/http.ts).
import { parseConfig } from "../lib/config/mod.ts";
import { createRuntime } from "../lib/serve/mod.ts";
import { createGenerateApp } from "../functions/generate/app.ts";

/** What prefixSharing measured. */
export interface PrefixSharingResult {
  tier: string;
  prefixTokens: number;
  /** TTFT of each run's first request (full prefill), ms */
  firstMs: number[];
  /** TTFT of each run's second request (same prefix, another tail), ms */
  secondMs: number[];
  /** second / first per run */
  ratios: number[];
  /** kvrelay_prefix_cache_shared_blocks_total and _copied_bytes_total after the runs */
  sharedBlocks: number;
  copiedBytes: number;
}

/**
 * Runs the measurement on tiny-powerful in a runtime of its own (prefix cache on).
 * @param runs pairs of requests
 * @param prefixTokens tokens of the shared prefix
 * @returns the TTFTs and the cache's counters
 */
export async function prefixSharing(runs = 5, prefixTokens = 1024): Promise<PrefixSharingResult> {
  const models = new URL("../models/", import.meta.url).pathname;
  const config = parseConfig({
    tiers: {
      powerful: {
        model: `${models}tiny-powerful`,
        max_context: Math.max(2048, prefixTokens + 64),
        max_new_tokens: 64,
        concurrency: 4,
        queue_depth: 4,
      },
    },
  }, { env: () => undefined, baseDir: models });
  const rt = await createRuntime(config);
  await rt.load();
  try {
    const app = createGenerateApp(rt);
    const vocab = rt.tiers.get("powerful")!.model.native.config.vocabSize;
    const ttft = async (prompt: number[]): Promise<number> => {
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
      const dec = new TextDecoder();
      let first = NaN, text = "";
      for await (const chunk of r.body!) {
        text += dec.decode(chunk, { stream: true });
        if (Number.isNaN(first) && /"text":"[^"]/.test(text)) first = performance.now() - t0;
      }
      return first;
    };
    const ids = (n: number, seed: number) =>
      Array.from({ length: n }, (_, i) => 10 + ((i * 7919 + seed * 104729) % (vocab - 10)));
    await ttft(ids(64, 999)); // warm-up
    const out: PrefixSharingResult = {
      tier: "powerful",
      prefixTokens,
      firstMs: [],
      secondMs: [],
      ratios: [],
      sharedBlocks: 0,
      copiedBytes: 0,
    };
    for (let i = 0; i < runs; i++) {
      const prefix = ids(prefixTokens, i + 1);
      const first = await ttft([...prefix, ...ids(16, 1000 + i)]);
      const second = await ttft([...prefix, ...ids(16, 2000 + i)]);
      out.firstMs.push(Math.round(first * 100) / 100);
      out.secondMs.push(Math.round(second * 100) / 100);
      out.ratios.push(Math.round((second / first) * 1000) / 1000);
    }
    const metrics = await (await app.request("/metrics")).text();
    const value = (name: string) =>
      Number(
        metrics.split("\n").find((l) => l.startsWith(`${name}{tier="powerful"} `))?.split(" ")[1] ??
          NaN,
      );
    out.sharedBlocks = value("kvrelay_prefix_cache_shared_blocks_total");
    out.copiedBytes = value("kvrelay_prefix_cache_copied_bytes_total");
    return out;
  } finally {
    await rt.close();
  }
}

/**
 * One line per run and the median ratio.
 * @param r the result
 * @returns the text
 */
export function formatPrefixSharing(r: PrefixSharingResult): string {
  const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const lines = r.ratios.map((x, i) =>
    `run ${i + 1}: first ${r.firstMs[i]} ms, second ${r.secondMs[i]} ms, ratio ${x}`
  );
  lines.push(
    `prefix sharing (${r.tier}, ${r.prefixTokens}-token prefix): second / first TTFT median ${
      med(r.ratios)
    } (first ${med(r.firstMs)} ms, second ${
      med(r.secondMs)
    } ms), shared blocks ${r.sharedBlocks}, KV bytes copied for hits ${r.copiedBytes}`,
  );
  return lines.join("\n");
}

if (import.meta.main) {
  const r = await prefixSharing(Number(Deno.args[0] ?? 5), Number(Deno.args[1] ?? 1024));
  console.log(formatPrefixSharing(r));
}
