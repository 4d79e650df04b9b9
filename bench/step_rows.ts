// `deno run -A --config deno.dev.json bench/step_rows.ts [rounds] [steps] [prompt_tokens] [threads]`:
// what one native batched decode step of tiny-powerful costs with 4 rows against 1 row (the
// choices of an n=4 request against n=1). Four paged sequences share one prefilled prompt's blocks
// (as forked choices do); each round, in process on `threads` kernel threads (default 2), runs
// `steps` decode steps of sequence 0 alone and `steps` of all four, for each way of drawing:
//   defaults: tiny-powerful's generation_config.json (temperature 0.7, top_p 0.95, repetition
//             penalty 1.3 over the prompt), what bench/choices.ts's requests get;
//   plain:    temperature 0.7 alone;
//   logits:   no draw: each row's logits returned (the lm_head), each step feeding a fixed token;
//   none:     no draw, nor the lm_head (no row wants logits), each step feeding a fixed token.
// The order of the eight runs rotates between rounds. Prints per step the median wall and CPU ms
// (the process's user + system time, all threads: the machine may be shared, CPU time is what the
// step costs) with their range, the 4-row/1-row ratios, the prompt's prefill (chunks of 256 as the
// scheduler runs it), and the n=4/n=1 ratio a request would have if it were nothing but its
// engine steps.
import { NativeModel, type NativeSampler, type NativeSequence } from "../lib/native/mod.ts";
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

type Mode = "defaults" | "plain" | "logits" | "none";
const MODES: Mode[] = ["defaults", "plain", "logits", "none"];
function samplers(mode: Mode): NativeSampler[] {
  return seqs.map((_, i) => {
    const plain = mode !== "defaults";
    const s = model.createSampler({
      temperature: 0.7,
      topK: 0,
      topP: plain ? 1 : 0.95,
      minP: 0,
      seed: i,
    });
    if (!plain) s.setRepetitionPenalty(1.3, prompt);
    return s;
  });
}
const drawWith = { defaults: samplers("defaults"), plain: samplers("plain") };

/** CPU seconds of this process (user + system, all threads; Linux /proc/self/stat). */
function cpuSeconds(): number {
  const stat = Deno.readTextFileSync("/proc/self/stat");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
}

interface Cost {
  wall: number;
  cpu: number;
}

/** `steps` decode steps of the first `rows` sequences; per step wall and CPU ms. */
async function run(rows: number, mode: Mode): Promise<Cost> {
  const next = seqs.slice(0, rows).map((_, i) => prompt[i]);
  const c0 = cpuSeconds(), t0 = performance.now();
  for (let s = 0; s < steps; s++) {
    const out = await model.batchStep(
      seqs.slice(0, rows).map((seq, i) => ({
        seq,
        tokens: [next[i]],
        wantLogits: mode === "logits",
        ...(mode === "defaults" || mode === "plain"
          ? { sample: { sampler: drawWith[mode][i] } }
          : {}),
      })),
    );
    if (mode === "none" || mode === "logits") continue;
    out.forEach((r, i) => {
      if (typeof r !== "number") throw new Error(`row ${i}: ${r}`);
      next[i] = r;
    });
  }
  const wall = (performance.now() - t0) / steps, cpu = (cpuSeconds() - c0) * 1000 / steps;
  for (const seq of seqs.slice(0, rows)) seq.truncate(promptTokens);
  return { wall, cpu };
}

/** The prompt's prefill as the scheduler runs it (chunks of 256 tokens) into a fresh sequence. */
async function prefill(): Promise<Cost> {
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
const runs = MODES.flatMap((mode) => [1, 4].map((rows) => ({ mode, rows })));
for (const { mode, rows } of runs) await run(rows, mode); // warm-up
const pre: Cost[] = [];
const costs = new Map(runs.map((r) => [`${r.mode} ${r.rows}`, [] as Cost[]]));
for (let r = 0; r < rounds; r++) {
  pre.push(await prefill());
  for (let j = 0; j < runs.length; j++) {
    const { mode, rows } = runs[(r + j) % runs.length];
    costs.get(`${mode} ${rows}`)!.push(await run(rows, mode));
  }
}
const line = (name: string, xs: Cost[], per: string) => {
  const wall = xs.map((x) => x.wall), cpu = xs.map((x) => x.cpu);
  return `${name}: wall ${median(wall).toFixed(2)} ${per} (${spread(wall)}), CPU ${
    median(cpu).toFixed(2)
  } ${per} (${spread(cpu)})`;
};
console.log(
  `tiny-powerful, ${threads} threads, ${promptTokens}-token context, ${rounds} rounds of ${steps} steps`,
);
console.log(line("prefill", pre, "ms"));
for (const mode of MODES) {
  const one = costs.get(`${mode} 1`)!, four = costs.get(`${mode} 4`)!;
  console.log(line(`${mode}, 1 row`, one, "ms/step"));
  console.log(line(`${mode}, 4 rows`, four, "ms/step"));
  const ratio = (x: (c: Cost) => number) => one.map((o, i) => x(four[i]) / x(o));
  // n=4 against n=1 if a request were nothing but its engine steps: a prefill and the decodes.
  const floor = (x: (c: Cost) => number) =>
    (median(pre.map(x)) + steps * median(four.map(x))) /
    (median(pre.map(x)) + steps * median(one.map(x)));
  console.log(
    `${mode}, 4 rows / 1 row per step: wall ${median(ratio((c) => c.wall)).toFixed(2)}× (${
      spread(ratio((c) => c.wall))
    }), CPU ${median(ratio((c) => c.cpu)).toFixed(2)}× (${
      spread(ratio((c) => c.cpu))
    }); prefill + ${steps} steps, 4 rows / 1 row: wall ${floor((c) => c.wall).toFixed(2)}×, CPU ${
      floor((c) => c.cpu).toFixed(2)
    }×`,
  );
}
for (const s of [...drawWith.defaults, ...drawWith.plain]) s.free();
for (const s of seqs) s.free();
pool.free();
