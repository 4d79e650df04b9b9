// Continuous-batching benchmark (`deno task bench batch`): in one process, through the real
// Scheduler + native batched step (no HTTP), 2 threads —
//   1. decode throughput: one request alone on the per-token path vs 32 concurrent requests in
//      batched steps, the scheduler's defaults (bursts of decode steps on) — aggregate decode
//      tokens/s, p50/p99 time per output token — tiny-fast and tiny-powerful;
//   2. chunked prefill: 16 requests decode while a 2,048-token prompt arrives; the time-per-
//      output-token trace of the decoders and each step's composition (bursts off), each chunk
//      step against that chunk alone, over 3 runs;
//   3. KV memory: 64 sequences of 200 tokens in the pool that 8 worst-case (max_context 2048)
//      sequences needed, peak blocks used.
// Medians and ratios come from the same run (the dev machine is shared and noisy).

import { decodeLoop, type LoadedModel, loadModel } from "../lib/engine/mod.ts";
import type { KvPool } from "../lib/native/mod.ts";
import {
  type NativeScheduler,
  nativeStepEngine,
  Scheduler,
  type StepStats,
} from "../lib/serve/mod.ts";

const root = new URL("../", import.meta.url).pathname;
const THREADS = 2;
const DECODE_TOKENS = 64;
const ALONE_TOKENS = 256; // per alone run (4 runs per round)
const ROUNDS = 5;

/** CPU seconds this process has used (user + system, all threads; /proc/self/stat, Linux). The
 * bench machine may be shared with other work, which makes wall-clock rates swing by several times
 * between runs; tokens per CPU-second are what the code controls. */
function cpuSeconds(): number {
  try {
    const stat = Deno.readTextFileSync("/proc/self/stat");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) / 100; // utime, stime in USER_HZ (100 on Linux)
  } catch {
    return NaN;
  }
}

function quantile(xs: number[], q: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
}
const r2 = (x: number) => Math.round(x * 100) / 100;

function prompt(model: LoadedModel, i: number, n: number): number[] {
  const ids: number[] = [];
  let s = (i + 1) * 2654435761;
  for (let k = 0; k < n; k++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    ids.push(s % model.tokenizer.vocabSize);
  }
  return ids;
}

/** One greedy request through the scheduler; token timestamps (ms) after the first. */
async function scheduled(
  model: LoadedModel,
  sched: NativeScheduler,
  pool: KvPool,
  ids: number[],
  maxTokens: number,
  ready?: Promise<void>,
  onPrefilled?: () => void,
): Promise<number[]> {
  const seq = pool.createSequence(ids.length + maxTokens + 1);
  const h = sched.attach(seq);
  try {
    const first = await h.prefill(ids);
    onPrefilled?.();
    await ready;
    const stamps: number[] = [];
    const loop = decodeLoop(h, first, {
      tokenizer: model.tokenizer,
      eosTokenIds: model.eosTokenIds,
      contextIds: ids,
      promptTokens: ids.length,
      startMs: performance.now(),
    }, { maxTokens, temperature: 0, stopTokenIds: [] });
    while (!(await loop.next()).done) stamps.push(performance.now());
    return stamps;
  } finally {
    h.detach();
    seq.free();
  }
}

/** Decode rate of one request at a time on the per-token path (kvr_seq_decode): 4 requests of
 * ALONE_TOKENS tokens one after the other. */
async function aloneDecode(
  model: LoadedModel,
  round: number,
): Promise<{ tps: number; cpuTps: number; tpot: number[]; requestTpot: number[] }> {
  const tpot: number[] = [];
  const requestTpot: number[] = [];
  let wall = 0, cpu = 0, tokens = 0;
  for (let r = 0; r < 4; r++) {
    const ids = prompt(model, round * 4 + r, 24);
    using seq = model.native.createSequence(ids.length + ALONE_TOKENS + 1);
    let logits = await seq.prefill(ids);
    const c0 = cpuSeconds();
    const stamps = [performance.now()];
    for (let i = 0; i < ALONE_TOKENS; i++) {
      let best = 0;
      for (let t = 1; t < logits.length; t++) if (logits[t] > logits[best]) best = t;
      logits = await seq.decode(best);
      stamps.push(performance.now());
    }
    cpu += cpuSeconds() - c0;
    wall += (stamps[ALONE_TOKENS] - stamps[0]) / 1000;
    tokens += ALONE_TOKENS;
    tpot.push(...stamps.slice(1).map((t, i) => t - stamps[i]));
    requestTpot.push((stamps[ALONE_TOKENS] - stamps[0]) / ALONE_TOKENS);
  }
  return { tps: tokens / wall, cpuTps: tokens / cpu, tpot, requestTpot };
}

/** Throughput at one concurrency through the scheduler, decode phase only. */
async function concurrent(model: LoadedModel, n: number) {
  const pool = model.native.createKvPool(4096, 16);
  const sched = new Scheduler(nativeStepEngine(model.native, pool), { maxStepTokens: 256 });
  let prefilled = 0;
  let release!: () => void;
  const ready = new Promise<void>((r) => release = r);
  const t0box = { t: 0, cpu: 0 };
  const tokensEach = n === 1 ? ALONE_TOKENS : DECODE_TOKENS;
  const runs = Array.from(
    { length: n },
    (_, i) =>
      scheduled(model, sched, pool, prompt(model, i, 24), tokensEach + 1, ready, () => {
        if (++prefilled === n) {
          t0box.t = performance.now();
          t0box.cpu = cpuSeconds();
          release();
        }
      }),
  );
  const stamps = await Promise.all(runs);
  const cpu = cpuSeconds() - t0box.cpu;
  const end = Math.max(...stamps.map((s) => s[s.length - 1]));
  const tpot = stamps.flatMap((s) => s.slice(1).map((t, i) => t - s[i]));
  // vLLM's TPOT: a request's mean interval between its tokens (its ITL are the `tpot` entries).
  const requestTpot = stamps.map((s) => (s[s.length - 1] - s[0]) / (s.length - 1));
  const tokens = stamps.reduce((a, s) => a + s.length - 1, 0);
  sched.close();
  pool.free();
  return {
    aggregate: tokens / ((end - t0box.t) / 1000),
    cpuTps: tokens / cpu,
    tpot,
    requestTpot,
    steps: sched.counters.steps,
  };
}

/** Result of one model's throughput comparison. */
export interface ThroughputRow {
  model: string;
  aloneTps: number;
  aloneTpotMs: { p50: number; p99: number };
  batched1Tps: number;
  batched32Tps: number;
  ratio32: number;
  /** decode tokens per CPU-second of the process (all threads), alone and at c=32 */
  aloneCpuTps: number;
  batched32CpuTps: number;
  cpuRatio32: number;
  /** per token (inter-token latency, vLLM's ITL): the interval before each token */
  tpot32Ms: { p50: number; p99: number };
  tpotRatioP99: number;
  /** per request (vLLM's TPOT): each request's mean interval between its tokens; p99 over the
   *  alone requests of every round and over the 32 requests of the median round */
  requestTpotMs: { aloneP99: number; c32P99: number };
  requestTpotRatioP99: number;
}

async function throughput(name: string): Promise<ThroughputRow> {
  const model = await loadModel(`${root}models/${name}`, { threads: THREADS });
  try {
    // Warm up, then alternate alone and batched rounds; medians.
    await aloneDecode(model, 99);
    const alone: Awaited<ReturnType<typeof aloneDecode>>[] = [];
    const c1: number[] = [];
    const c32: Awaited<ReturnType<typeof concurrent>>[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      alone.push(await aloneDecode(model, round));
      c1.push((await concurrent(model, 1)).aggregate);
      c32.push(await concurrent(model, 32));
    }
    const aloneTps = quantile(alone.map((a) => a.tps), 0.5);
    const aloneCpu = quantile(alone.map((a) => a.cpuTps), 0.5);
    const aloneTpot = alone.flatMap((a) => a.tpot);
    const mid = [...c32].sort((a, b) => a.aggregate - b.aggregate)[Math.floor(ROUNDS / 2)];
    const midCpu = quantile(c32.map((c) => c.cpuTps), 0.5);
    const aloneP99 = quantile(aloneTpot, 0.99);
    return {
      model: name,
      aloneTps: Math.round(aloneTps),
      aloneTpotMs: { p50: r2(quantile(aloneTpot, 0.5)), p99: r2(aloneP99) },
      batched1Tps: Math.round(quantile(c1, 0.5)),
      batched32Tps: Math.round(mid.aggregate),
      ratio32: r2(mid.aggregate / aloneTps),
      aloneCpuTps: Math.round(aloneCpu),
      batched32CpuTps: Math.round(midCpu),
      cpuRatio32: r2(midCpu / aloneCpu),
      tpot32Ms: { p50: r2(quantile(mid.tpot, 0.5)), p99: r2(quantile(mid.tpot, 0.99)) },
      tpotRatioP99: r2(quantile(mid.tpot, 0.99) / aloneP99),
      requestTpotMs: {
        aloneP99: r2(quantile(alone.flatMap((a) => a.requestTpot), 0.99)),
        c32P99: r2(quantile(mid.requestTpot, 0.99)),
      },
      requestTpotRatioP99: r2(
        quantile(mid.requestTpot, 0.99) / quantile(alone.flatMap((a) => a.requestTpot), 0.99),
      ),
    };
  } finally {
    model.native.free();
  }
}

/** The chunked-prefill experiment. */
export interface ChunkedPrefillResult {
  model: string;
  decoders: number;
  promptTokens: number;
  maxStepTokens: number;
  /** median interval between a decoder's tokens before the prompt arrived, ms */
  tpotBeforeMs: number;
  /** largest interval between a decoder's tokens while the prompt was prefilled, ms */
  tpotMaxDuringMs: number;
  /** median step time of a decode-only step and of a step carrying a prompt chunk, ms */
  decodeStepMs: number;
  chunkStepMs: number;
  /** tpotMaxDuringMs − tpotBeforeMs: what the prompt added to a decoder's next token */
  addedDelayMs: number;
  /** each prompt chunk prefilled alone at its own positions (one sequence, chunk after chunk), ms:
   *  "one chunk's compute" — chunks cost more as the prompt grows (attention over more positions) */
  chunkAloneMs: number[];
  /** the chunk step that added the most beyond its own chunk's compute: its index, the delay it
   *  added to decoder 0's next token (interval − tpotBeforeMs), that chunk alone, and the excess
   *  (added − alone; ≤ 0 meets "at most one chunk's compute") */
  worst: { chunk: number; addedMs: number; aloneMs: number; excessMs: number };
  /** per chunk: the delay its step added to decoder 0's next token (interval − tpotBeforeMs), ms */
  chunkAddedMs: number[];
  /** decoder 0's intervals, ms, with the step composition: [ms, prefill tokens in that step] */
  trace: [number, number][];
  /** the experiment repeated (fresh scheduler and pool each time): per chunk the median over the
   *  runs of (added − alone), and the worst chunk by that median — the single worst interval of one
   *  run above is decided by one noisy sample */
  repeated?: {
    runs: number;
    excessMedianMs: number[];
    worstChunk: number;
    worstExcessMedianMs: number;
  };
}

/** The chunked-prefill experiment `runs` times; the first run's result with the medians. */
async function chunkedPrefillRepeated(name: string, runs: number): Promise<ChunkedPrefillResult> {
  const all: ChunkedPrefillResult[] = [];
  for (let r = 0; r < runs; r++) all.push(await chunkedPrefill(name));
  const chunks = Math.min(...all.map((a) => a.chunkAloneMs.length));
  const excessMedianMs: number[] = [];
  for (let c = 0; c < chunks; c++) {
    const ex = all.map((a) => a.chunkAddedMs[c] - a.chunkAloneMs[c]).filter((x) => !isNaN(x));
    excessMedianMs.push(r2(quantile(ex, 0.5)));
  }
  const worstChunk = excessMedianMs.indexOf(Math.max(...excessMedianMs));
  return {
    ...all[0],
    repeated: { runs, excessMedianMs, worstChunk, worstExcessMedianMs: excessMedianMs[worstChunk] },
  };
}

async function chunkedPrefill(name: string): Promise<ChunkedPrefillResult> {
  const model = await loadModel(`${root}models/${name}`, { threads: THREADS });
  const maxStepTokens = 256, decoders = 16, promptTokens = 2048;
  const pool = model.native.createKvPool(2048, 16);
  const steps: (StepStats & { at: number })[] = [];
  // Bursts off: this measures what one step with a prompt chunk adds to a decoder's next token
  // (with bursts on, the prompt first waits for the burst in progress: decode_burst_ms at most).
  const sched = new Scheduler(nativeStepEngine(model.native, pool), {
    maxStepTokens,
    maxDecodeSteps: 1,
  }, {
    onStep: (s) => steps.push({ ...s, at: performance.now() }),
  });
  try {
    let arrivedAt = 0, doneAt = 0;
    // Decoders long enough to run through the whole prompt (a token per step while it prefills).
    const runs = Array.from(
      { length: decoders },
      (_, i) => scheduled(model, sched, pool, prompt(model, i, 16), 200),
    );
    await new Promise((r) => setTimeout(r, 60));
    arrivedAt = performance.now();
    const long = scheduled(model, sched, pool, prompt(model, 777, promptTokens), 1).then(() => {
      doneAt = performance.now();
    });
    const stamps = await Promise.all(runs);
    await long;
    const before: number[] = [], during: number[] = [];
    for (const s of stamps) {
      for (let i = 1; i < s.length; i++) {
        const dt = s[i] - s[i - 1];
        if (s[i] < arrivedAt) before.push(dt);
        else if (s[i - 1] >= arrivedAt && s[i] <= doneAt + 1) during.push(dt);
      }
    }
    const decodeSteps = steps.filter((s) => s.prefillTokens === 0).map((s) => s.ms);
    const chunkSteps = steps.filter((s) => s.prefillTokens > 0 && s.at > arrivedAt).map((s) =>
      s.ms
    );
    // Each chunk alone at its own positions: the prompt fed chunk by chunk to one sequence.
    const chunkLens = steps.filter((s) => s.prefillTokens > 0 && s.at > arrivedAt).map((s) =>
      s.prefillTokens
    );
    using seq = model.native.createSequence(promptTokens + 1);
    const ids = prompt(model, 777, promptTokens);
    const chunkAloneMs: number[] = [];
    // A step's prefill tokens after the arrival may include a decoder's own prompt or a
    // preemption's recompute (the stats do not say whose), so the chunks stop at the prompt's end.
    for (
      let j = 0, start = 0;
      j < chunkLens.length && start < ids.length;
      start += chunkLens[j++]
    ) {
      const t0 = performance.now();
      await seq.prefill(ids.slice(start, Math.min(ids.length, start + chunkLens[j])));
      chunkAloneMs.push(performance.now() - t0);
    }
    const tpotBefore = quantile(before, 0.5);
    const s0 = stamps[0];
    const trace: [number, number][] = [];
    const worst = { chunk: -1, addedMs: 0, aloneMs: 0, excessMs: -Infinity };
    const chunkAddedMs: number[] = chunkAloneMs.map(() => NaN);
    for (let i = 1; i < s0.length; i++) {
      const at = steps.findIndex((s) => Math.abs(s.at - s0[i]) < 0.5 || s.at >= s0[i]);
      const st = steps[at];
      trace.push([r2(s0[i] - s0[i - 1]), st?.prefillTokens ?? 0]);
      if (!st || st.prefillTokens === 0 || s0[i - 1] < arrivedAt) continue;
      const chunk = steps.slice(0, at + 1).filter((s) => s.prefillTokens > 0 && s.at > arrivedAt)
        .length - 1;
      const added = s0[i] - s0[i - 1] - tpotBefore;
      if (!(added <= chunkAddedMs[chunk])) chunkAddedMs[chunk] = added; // max (NaN: first)
      const excess = added - chunkAloneMs[chunk];
      if (excess > worst.excessMs) {
        Object.assign(worst, {
          chunk,
          addedMs: added,
          aloneMs: chunkAloneMs[chunk],
          excessMs: excess,
        });
      }
    }
    const maxDuring = Math.max(...during);
    return {
      model: name,
      decoders,
      promptTokens,
      maxStepTokens,
      tpotBeforeMs: r2(tpotBefore),
      tpotMaxDuringMs: r2(maxDuring),
      decodeStepMs: r2(quantile(decodeSteps, 0.5)),
      chunkStepMs: r2(quantile(chunkSteps, 0.5)),
      addedDelayMs: r2(maxDuring - tpotBefore),
      chunkAloneMs: chunkAloneMs.map(r2),
      chunkAddedMs: chunkAddedMs.map(r2),
      worst: {
        chunk: worst.chunk,
        addedMs: r2(worst.addedMs),
        aloneMs: r2(worst.aloneMs),
        excessMs: r2(worst.excessMs),
      },
      trace,
    };
  } finally {
    sched.close();
    pool.free();
    model.native.free();
  }
}

/** The KV memory experiment. */
export interface KvMemoryResult {
  model: string;
  maxContext: number;
  /** blocks 8 worst-case sequences needed (8 × max_context / block_tokens) = the pool */
  poolBlocks: number;
  sequences: number;
  tokensPerSequence: number;
  peakBlocksUsed: number;
  preemptions: number;
  completed: number;
}

async function kvMemory(name: string): Promise<KvMemoryResult> {
  const model = await loadModel(`${root}models/${name}`, { threads: THREADS });
  const maxContext = 2048, blockTokens = 16, n = 64, promptLen = 100, gen = 100;
  const poolBlocks = 8 * maxContext / blockTokens;
  const pool = model.native.createKvPool(poolBlocks, blockTokens);
  let peak = 0;
  const sched = new Scheduler(nativeStepEngine(model.native, pool), { maxStepTokens: 512 }, {
    onStep: (s) => peak = Math.max(peak, s.blocksUsed),
  });
  try {
    let completed = 0;
    await Promise.all(Array.from({ length: n }, async (_, i) => {
      const s = await scheduled(model, sched, pool, prompt(model, i, promptLen), gen);
      if (s.length === gen) completed++;
    }));
    return {
      model: name,
      maxContext,
      poolBlocks,
      sequences: n,
      tokensPerSequence: promptLen + gen,
      peakBlocksUsed: peak,
      preemptions: sched.counters.preemptions,
      completed,
    };
  } finally {
    sched.close();
    pool.free();
    model.native.free();
  }
}

/** What benchBatch returns. */
export interface BatchBenchResult {
  threads: number;
  decodeTokens: number;
  throughput: ThroughputRow[];
  chunkedPrefill: ChunkedPrefillResult;
  kvMemory: KvMemoryResult;
}

/**
 * Runs the three experiments (see the file comment).
 * @returns the results
 */
export async function benchBatch(): Promise<BatchBenchResult> {
  const rows: ThroughputRow[] = [];
  for (const m of ["tiny-fast", "tiny-powerful"]) rows.push(await throughput(m));
  return {
    threads: THREADS,
    decodeTokens: DECODE_TOKENS,
    throughput: rows,
    chunkedPrefill: await chunkedPrefillRepeated("tiny-powerful", 3),
    kvMemory: await kvMemory("tiny-powerful"),
  };
}

/**
 * Formats the results as text tables.
 * @param r the results
 * @returns the tables
 */
export function formatBatchTable(r: BatchBenchResult): string {
  const lines = [
    `decode throughput (${r.threads} threads; alone: 4 × ${ALONE_TOKENS} tokens per round, c=32: ${r.decodeTokens} tokens each; medians of ${ROUNDS} alternating rounds)`,
    "model          alone tok/s  batched c=1  c=32 tok/s  ratio | tok/CPU-s alone  c=32  ratio | per-token p99 ms alone  c=32  ratio | per-request TPOT p99 ms alone  c=32  ratio",
  ];
  for (const t of r.throughput) {
    const cells = [
      t.model.padEnd(14),
      String(t.aloneTps).padStart(11),
      String(t.batched1Tps).padStart(11),
      String(t.batched32Tps).padStart(10),
      t.ratio32.toFixed(2).padStart(5),
      "|",
      String(t.aloneCpuTps).padStart(15),
      String(t.batched32CpuTps).padStart(5),
      t.cpuRatio32.toFixed(2).padStart(5),
      "|",
      t.aloneTpotMs.p99.toFixed(2).padStart(22),
      t.tpot32Ms.p99.toFixed(2).padStart(5),
      t.tpotRatioP99.toFixed(2).padStart(5),
      "|",
      t.requestTpotMs.aloneP99.toFixed(2).padStart(29),
      t.requestTpotMs.c32P99.toFixed(2).padStart(5),
      t.requestTpotRatioP99.toFixed(2).padStart(5),
    ];
    lines.push(cells.join("  ").replaceAll("  |  ", " | "));
  }
  const c = r.chunkedPrefill;
  lines.push(
    "",
    `chunked prefill (${c.model}): ${c.decoders} decoding, a ${c.promptTokens}-token prompt arrives; step budget ${c.maxStepTokens} tokens`,
    `  TPOT before ${c.tpotBeforeMs} ms, max while the prompt prefills ${c.tpotMaxDuringMs} ms (+${c.addedDelayMs} ms)`,
    `  step: decode-only ${c.decodeStepMs} ms, with a chunk ${c.chunkStepMs} ms (median); each chunk alone at its positions: ${
      c.chunkAloneMs.join(" ")
    } ms`,
    `  worst chunk step (decoder 0): chunk ${c.worst.chunk} added ${c.worst.addedMs} ms to the next token, that chunk alone ${c.worst.aloneMs} ms (excess ${c.worst.excessMs} ms; ≤ 0: at most one chunk's compute)`,
    ...(c.repeated
      ? [
        `  over ${c.repeated.runs} runs, per chunk the median excess (added − alone): ${
          c.repeated.excessMedianMs.join(" ")
        } ms; worst: chunk ${c.repeated.worstChunk} ${c.repeated.worstExcessMedianMs} ms`,
      ]
      : []),
    `  decoder 0 trace [ms, prefill tokens in step]: ${
      c.trace.map(([ms, p]) => p ? `${ms}*` : `${ms}`).join(" ")
    }`,
  );
  const k = r.kvMemory;
  lines.push(
    "",
    `KV memory (${k.model}): pool = 8 × max_context ${k.maxContext} = ${k.poolBlocks} blocks; ${k.sequences} sequences × ${k.tokensPerSequence} tokens: peak ${k.peakBlocksUsed} blocks used, ${k.preemptions} preemptions, ${k.completed}/${k.sequences} completed`,
  );
  return lines.join("\n");
}
