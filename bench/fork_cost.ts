// `deno run -A --config deno.dev.json bench/fork_cost.ts [prompt_tokens] [runs]`: what one forked
// choice (n > 1) costs on tiny-powerful's pool before its first token: copying the prompt's KV
// layer by layer into a fresh paged sequence (readKv/writeKv, what a fork did before blocks were
// shared) against adopting the prompt's blocks (NativeSequence.adopt). Prints the median time and
// the pool blocks each takes.
import { NativeModel } from "../lib/native/mod.ts";
import { checkpoint, tokens } from "../lib/native/test_helpers.ts";

const promptTokens = Number(Deno.args[0] ?? 512);
const runs = Number(Deno.args[1] ?? 9);
const dir = new URL("../models/tiny-powerful", import.meta.url).pathname;
using model = NativeModel.load(await checkpoint(dir), { threads: 2 });
const pool = model.createKvPool(512, 16);
const src = pool.createSequence(2048);
await src.prefill(tokens(promptTokens, model.config.vocabSize, 1));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

function copyFork(): void {
  const seq = pool.createSequence(2048);
  for (let layer = 0; layer < model.config.numLayers; layer++) {
    const { k, v } = src.readKv(layer, 0, promptTokens);
    seq.writeKv(layer, 0, promptTokens, k, v);
  }
  seq.setLength(promptTokens);
  forks.push(seq);
}
function adoptFork(): void {
  const seq = pool.createSequence(2048);
  seq.adopt(src.blockTable(), promptTokens);
  forks.push(seq);
}
const forks: ReturnType<typeof pool.createSequence>[] = [];
for (const [name, fork] of [["copy", copyFork], ["adopt", adoptFork]] as const) {
  const ms: number[] = [];
  let blocks = 0;
  for (let i = 0; i < runs; i++) {
    const free = pool.blocksFree;
    const t0 = performance.now();
    fork();
    ms.push(performance.now() - t0);
    blocks = free - pool.blocksFree;
    forks.pop()!.free();
  }
  console.log(
    `${name}: ${
      median(ms).toFixed(3)
    } ms per choice (${promptTokens}-token prompt, median of ${runs}), ${blocks} new pool blocks`,
  );
}
src.free();
pool.free();
