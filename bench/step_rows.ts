// `deno run -A --config deno.dev.json bench/step_rows.ts [rounds] [steps] [prompt_tokens] [threads]`: what
// one native batched decode step of tiny-powerful costs with 4 rows against 1 row (the choices of
// an n=4 request against n=1): four paged sequences share one prefilled prompt's blocks (as forked
// choices do), then each round runs `steps` sampled decode steps of sequence 0 alone and `steps`
// of all four (order alternating between rounds), in process, on 2 kernel threads unless given. Prints per step the
// median wall ms and CPU ms (the process's user + system time, all threads: the machine may be
// shared, CPU time is what the step itself costs) and the 4-row/1-row ratios, with their spread;
// and the prompt's prefill (chunks of 256, as the scheduler runs it), for the ratio n=4 / n=1
// would have if a request were nothing but its engine steps.
import { NativeModel, type NativeSequence } from "../lib/native/mod.ts";
import { checkpoint, tokens } from "../lib/native/test_helpers.ts";

const rounds = Number(Deno.args[0] ?? 7);
const steps = Number(Deno.args[1] ?? 64);
const promptTokens = Number(Deno.args[2] ?? 512);
const threads = Number(Deno.args[3] ?? 2);
const dir = new URL("../models/tiny-powerful", import.meta.url).pathname;
using model = NativeModel.load(await checkpoint(dir), { threads });
const pool = model.createKvPool(256, 16);
const prompt = tokens(promptTokens, model.config.vocabSize, 1);
const seqs: NativeSequence[] = [pool.createSequence(1024)];
await seqs[0].prefill(prompt);
for (let i = 1; i < 4; i++) {
  const s = pool.createSequence(1024);
  s.adopt(seqs[0].blockTable(), promptTokens);
  seqs.push(s);
}
const samplers = seqs.map((_, i) =>
  model.createSampler({ temperature: 0.7, topK: 0, topP: 1, minP: 0, seed: i })
);

/** CPU seconds of this process (user + system, all threads; Linux /proc/self/stat). */
function cpuSeconds(): number {
  const stat = Deno.readTextFileSync("/proc/self/stat");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
}

/** `steps` decode steps of the first `rows` sequences; per step wall and CPU ms. */
async function run(rows: number): Promise<{ wall: number; cpu: number }> {
  const next = seqs.slice(0, rows).map((_, i) => prompt[i]);
  const c0 = cpuSeconds(), t0 = performance.now();
  for (let s = 0; s < steps; s++) {
    const out = await model.batchStep(
      seqs.slice(0, rows).map((seq, i) => ({
        seq,
        tokens: [next[i]],
        wantLogits: false,
        sample: { sampler: samplers[i] },
      })),
    );
    out.forEach((r, i) => {
      if (typeof r !== "number") throw new Error(`row ${i}: ${r}`);
      next[i] = r;
    });
  }
  const wall = (performance.now() - t0) / steps, cpu = (cpuSeconds() - c0) * 1000 / steps;
  for (const seq of seqs.slice(0, rows)) seq.truncate(promptTokens);
  return { wall, cpu };
}

/** The prompt's prefill as the scheduler runs it (chunks of 256 tokens) into a fresh sequence:
 *  wall and CPU ms. */
async function prefill(): Promise<{ wall: number; cpu: number }> {
  const seq = pool.createSequence(1024);
  const c0 = cpuSeconds(), t0 = performance.now();
  for (let at = 0; at < promptTokens; at += 256) {
    const chunk = prompt.slice(at, at + 256);
    await model.batchStep([{ seq, tokens: chunk, wantLogits: at + 256 >= promptTokens }]);
  }
  const out = { wall: performance.now() - t0, cpu: (cpuSeconds() - c0) * 1000 };
  seq.free();
  return out;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const spread = (xs: number[]) => `${Math.min(...xs).toFixed(2)}–${Math.max(...xs).toFixed(2)}`;
await run(1);
await run(4);
const one: { wall: number; cpu: number }[] = [], four: typeof one = [], pre: typeof one = [];
for (let r = 0; r < rounds; r++) {
  pre.push(await prefill());
  if (r % 2 === 0) {
    one.push(await run(1));
    four.push(await run(4));
  } else {
    four.push(await run(4));
    one.push(await run(1));
  }
}
for (const [name, xs] of [["prefill", pre], ["1 row", one], ["4 rows", four]] as const) {
  const per = name === "prefill" ? "ms" : "ms/step";
  const wall = xs.map((x) => x.wall), cpu = xs.map((x) => x.cpu);
  console.log(
    `${name}: wall ${median(wall).toFixed(2)} ${per} (${spread(wall)}), CPU ${
      median(cpu).toFixed(2)
    } ${per} (${spread(cpu)})`,
  );
}
const wallRatios = one.map((o, i) => four[i].wall / o.wall);
const cpuRatios = one.map((o, i) => four[i].cpu / o.cpu);
console.log(
  `4 rows / 1 row per step (${rounds} rounds of ${steps} steps, ${promptTokens}-token context, ${threads} threads): wall median ${
    median(wallRatios).toFixed(2)
  }× (${spread(wallRatios)}), CPU median ${median(cpuRatios).toFixed(2)}× (${spread(cpuRatios)})`,
);
// What n=4 would cost against n=1 if a request were nothing but its engine steps: one prefill and
// `steps` decode steps of 1 row, or of 4 rows.
const floor = (x: (r: { wall: number; cpu: number }) => number) =>
  (median(pre.map(x)) + steps * median(four.map(x))) /
  (median(pre.map(x)) + steps * median(one.map(x)));
console.log(
  `engine steps alone, prefill + ${steps} decode steps, 4 rows / 1 row: wall ${
    floor((r) => r.wall).toFixed(2)
  }×, CPU ${floor((r) => r.cpu).toFixed(2)}×`,
);
for (const s of samplers) s.free();
for (const s of seqs) s.free();
pool.free();
