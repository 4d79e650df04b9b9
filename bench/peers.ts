// Peer benchmark: kvrelay against llama.cpp at its best (node-llama-cpp's prebuilt library via
// llama.h with a persistent thread pool; flash attention and KV types tried) on the same weights:
// the demo models (and, when asked, the real-size Qwen3-0.6B / Llama-3.2-1B shapes) converted to
// GGUF per weight format. First both engines must produce the same logits (f32 weights: 1e-4
// relative, same top-1) or the section fails; then one alternating run, medians per column, and
// kvrelay/llama.cpp throughput ratios (> 1: kvrelay faster). Method: docs/peers.md.

import { loadCheckpoint } from "../lib/model/mod.ts";
import { type LoadedModel, loadModel } from "../lib/engine/mod.ts";
import type { KvDtype, NativeModelOptions } from "../lib/native/mod.ts";
import { median } from "./machine.ts";
import { argmax, compareLogits } from "./peers/agreement.ts";
import { copyBandwidth } from "./peers/bandwidth.ts";
import { convertToGguf, type GgufWeightType, writeF32Copy } from "./peers/convert.ts";
import {
  type KvTypeName,
  type LlamaContext,
  LlamaCpp,
  type LlamaModel,
  NODE_LLAMA_CPP_VERSION,
} from "./peers/llama_cpp.ts";

const root = new URL("../", import.meta.url).pathname;
const WORK_DIR = `${root}build/peers`;

/** Timed columns: prefill of n tokens from empty, and decode steps after a 512-token prefill. */
export const COLUMNS = ["prefill128", "prefill512", "prefill2048", "decode@512"] as const;
/** A column name. */
export type Column = typeof COLUMNS[number];
const ALL: readonly Column[] = COLUMNS;
const DECODE_CONTEXT = 512;
const DECODE_STEPS = 32;
const CHECK_PROMPT_TOKENS = 48;
const CHECK_DECODE_STEPS = 6;
/** f32 weights: llama.cpp and kvrelay logits must agree this closely (relative to max |logit|). */
export const F32_TOLERANCE = 1e-4;

/**
 * Weight formats compared, in order. A format is measured for kvrelay when kvrelay supports it:
 * `copyF32` loads an F32 copy of the checkpoint; `weights` is passed as NativeModelOptions.weights
 * and counts as supported when the resident weights shrink accordingly (so `weights: q8` is picked
 * up as soon as the engine implements it). llama.cpp runs every format.
 */
export const WEIGHT_FORMATS: {
  name: string;
  gguf: GgufWeightType;
  bytesPerWeight: number;
  kvrelay: { copyF32?: boolean; weights?: string; maxWeightRatioToBf16?: number };
  demoOnly?: boolean;
}[] = [
  { name: "f32", gguf: "F32", bytesPerWeight: 4, kvrelay: { copyF32: true }, demoOnly: true },
  { name: "bf16", gguf: "BF16", bytesPerWeight: 2, kvrelay: {} },
  {
    name: "q8",
    gguf: "Q8_0",
    bytesPerWeight: 34 / 32,
    kvrelay: { weights: "q8", maxWeightRatioToBf16: 0.75 },
  },
  {
    // llama.cpp Q4_0 (symmetric, f16 scale per 32) against kvrelay's q4 (f16 scale + offset per
    // 32, least-squares fit: equal or better quality, 0.625 vs 0.5625 bytes per weight)
    name: "q4",
    gguf: "Q4_0",
    bytesPerWeight: 18 / 32,
    kvrelay: { weights: "q4", maxWeightRatioToBf16: 0.75 },
  },
];

/** llama.cpp context settings tried; the best per column is "llama.cpp best". */
export const LLAMA_CONFIGS: { flashAttn: boolean; kvType: KvTypeName; threads?: number }[] = [
  { flashAttn: false, kvType: "f16" }, // llama.cpp's default KV type
  { flashAttn: true, kvType: "f16" },
  { flashAttn: false, kvType: "f32" },
  { flashAttn: true, kvType: "f32" },
  // One thread has no spin barrier: on a shared (oversubscribed) machine ggml's spinning
  // barriers make 2 threads collapse, and a user of these 2 cores would pick -t 1. It is a
  // candidate for "best" (at most the section's threads), named in the output when it wins.
  { flashAttn: true, kvType: "f16", threads: 1 },
  { flashAttn: false, kvType: "f16", threads: 1 },
];
const configName = (c: { flashAttn: boolean; kvType: string; threads?: number }) =>
  `${c.threads ? `t=${c.threads},` : ""}fa=${c.flashAttn ? "on" : "off"},kv=${c.kvType}`;

/** Options of the peers section. */
export interface PeersOptions {
  /** model directories (demo models and generated real shapes) with a flag for real size */
  models: { dir: string; realSize: boolean }[];
  threads: number;
  /** alternating rounds for demo models (medians over them) */
  runs: number;
  /** rounds for real-size shapes (slow) */
  realRuns: number;
  /** weight formats to run (default: all of WEIGHT_FORMATS) */
  formats?: string[];
  /** columns to time (default: all of COLUMNS), to split a slow real-size run into parts */
  columns?: Column[];
  /**
   * kvrelay's KV cache dtype (default: the engine's f32). `f16` compares at llama.cpp's own
   * default KV type (the only one its real-size configurations use); it changes kvrelay's
   * results, so it is named in the output and its quality is in the logits check (docs/peers.md).
   */
  kvrelayKv?: KvDtype;
}

type Rates = Record<Column, number>;

/** One model × weight format. */
export interface PeersFormatResult {
  format: string;
  kvrelaySupported: boolean;
  kvrelayNote?: string;
  ggufBytes: number;
  /** logits vs the reference (kvrelay at the model's most exact format), teacher-forced path */
  quality: {
    reference: string;
    kvrelay?: { worstRelMaxDiff: number; top1Agree: string };
    llamaCpp: { worstRelMaxDiff: number; top1Agree: string };
    /** llama.cpp vs kvrelay on this format (the gate for f32) */
    llamaVsKvrelay?: { worstRelMaxDiff: number; top1Agree: string };
  };
  memory: {
    kvrelayWeightBytes?: number;
    kvrelayRssDeltaBytes?: number;
    llamaModelBytes: number;
    llamaRssDeltaBytes: number;
  };
  /** tokens/s medians over the alternating rounds */
  kvrelay?: Rates;
  /** tokens/s of every llama.cpp configuration in the screening round (one sample each) */
  llamaCpp: Record<string, Rates>;
  /** per column: the screening's fastest configuration, median over the alternating rounds */
  llamaBest: Record<Column, { tokensPerSecond: number; config: string }>;
  /**
   * Per column, each timed round's tokens/s of kvrelay and of llama.cpp's best configuration, in
   * round order (one sample per round: the spread shows what a single round can say)
   */
  rounds?: Record<Column, { kvrelay: number[]; llamaBest: number[] }>;
  /** kvrelay / llama.cpp best, per column */
  ratio?: Record<Column, number>;
  /** decode tokens/s at the memory-bandwidth floor, and each engine's share of it */
  floor?: { weightBytesPerToken: number; tokensPerSecond: number; kvrelay?: number; llama: number };
}

/** One model's results. */
export interface PeersModelResult {
  model: string;
  realSize: boolean;
  params: number;
  runs: number;
  /** /proc/loadavg 1-minute load before and after the model (the machine is shared) */
  loadAverage: [number, number];
  formats: PeersFormatResult[];
  /** kvrelay's best supported format vs llama.cpp's best format and config, per column */
  bestVsBest?: Record<Column, { ratio: number; kvrelay: string; llama: string }>;
}

/** Result of the peers section. */
export interface PeersResult {
  threads: number;
  /** the columns timed (a subset of COLUMNS when asked) */
  columns: Column[];
  llamaCpp: {
    nodeLlamaCppVersion: string;
    systemInfo: string;
    cpuBackend: string;
    configs: string[];
  };
  cpuFlags: string[];
  copyBandwidth: { threads: number; bytesPerSecond: number }[];
  /** kvrelay's KV cache dtype in this run */
  kvrelayKv: KvDtype;
  models: PeersModelResult[];
}

function promptIds(n: number, vocab: number, seed = 12345): number[] {
  let state = seed;
  return Array.from({ length: n }, () => {
    state = (state * 1103515245 + 12345) >>> 0;
    return state % vocab;
  });
}

async function rss(): Promise<{ rss: number; anon: number; file: number }> {
  const s = await Deno.readTextFile("/proc/self/status").catch(() => "");
  const kb = (k: string) =>
    Number(s.match(new RegExp(`^${k}:\\s+(\\d+) kB`, "m"))?.[1] ?? 0) * 1024;
  return { rss: kb("VmRSS"), anon: kb("RssAnon"), file: kb("RssFile") };
}

async function loadAverage(): Promise<number> {
  const s = await Deno.readTextFile("/proc/loadavg").catch(() => "");
  return Number(s.split(" ")[0] ?? NaN);
}

async function newer(path: string, than: string[]): Promise<boolean> {
  const t = await Deno.stat(path).then((s) => s.mtime?.getTime() ?? 0, () => -1);
  if (t < 0) return false;
  for (const p of than) {
    if ((await Deno.stat(p)).mtime!.getTime() > t) return false;
  }
  return true;
}

/** The GGUF of a model in a format, converted when missing or older than its inputs. */
async function ggufFor(dir: string, format: GgufWeightType): Promise<string> {
  const name = dir.split("/").filter(Boolean).pop()!;
  const out = `${WORK_DIR}/${name}/${name}-${format}.gguf`;
  const ckpt = await loadCheckpoint(dir);
  const inputs = [...ckpt.files, `${root}bench/peers/convert.ts`, `${root}bench/peers/gguf.ts`];
  if (!(await newer(out, inputs))) {
    await Deno.mkdir(`${WORK_DIR}/${name}`, { recursive: true });
    await convertToGguf(ckpt, out, format);
  }
  return out;
}

/** kvrelay's F32 copy of a checkpoint (written when missing or stale). */
async function f32CopyFor(dir: string): Promise<string> {
  const name = dir.split("/").filter(Boolean).pop()!;
  const out = `${WORK_DIR}/${name}/f32`;
  const ckpt = await loadCheckpoint(dir);
  if (!(await newer(`${out}/model.safetensors`, [...ckpt.files]))) await writeF32Copy(ckpt, out);
  return out;
}

/** Logits along a fixed token path: prompt, then each of `next` fed one at a time. */
async function kvrelayPath(m: LoadedModel, prompt: number[], next: number[]) {
  const seq = m.native.createSequence(prompt.length + next.length + 1);
  try {
    const out = [await seq.prefill(prompt)];
    for (const t of next) out.push(await seq.decode(t));
    return out;
  } finally {
    seq.free();
  }
}

function llamaPath(ctx: LlamaContext, prompt: number[], next: number[]) {
  ctx.clear();
  const out = [ctx.eval(prompt)];
  for (const t of next) out.push(ctx.eval([t]));
  ctx.clear();
  return out;
}

function agreement(a: Float32Array[], b: Float32Array[]) {
  const per = a.map((x, i) => compareLogits(x, b[i]));
  return {
    worstRelMaxDiff: Math.max(...per.map((p) => p.relMaxDiff)),
    top1Agree: `${per.filter((p) => p.top1Equal).length}/${per.length}`,
  };
}

// One engine under test: measures one column, returns tokens/s.
interface Variant {
  name: string;
  measure(column: Column, ids: Record<Column, number[]>): Promise<number>;
  idle(): void;
}

function kvrelayVariant(m: LoadedModel): Variant {
  return {
    name: "kvrelay",
    async measure(column, ids) {
      if (column === "decode@512") {
        const seq = m.native.createSequence(DECODE_CONTEXT + DECODE_STEPS);
        try {
          await seq.prefill(ids[column].slice(0, DECODE_CONTEXT));
          const steps = ids[column].slice(DECODE_CONTEXT);
          const t0 = performance.now();
          for (const t of steps) await seq.decode(t);
          return steps.length / ((performance.now() - t0) / 1000);
        } finally {
          seq.free();
        }
      }
      const seq = m.native.createSequence(ids[column].length);
      try {
        const t0 = performance.now();
        await seq.prefill(ids[column]);
        return ids[column].length / ((performance.now() - t0) / 1000);
      } finally {
        seq.free();
      }
    },
    idle() {},
  };
}

function llamaVariant(ctx: LlamaContext, name: string): Variant {
  return {
    name,
    // deno-lint-ignore require-await
    async measure(column, ids) {
      ctx.clear();
      if (column === "decode@512") {
        ctx.eval(ids[column].slice(0, DECODE_CONTEXT));
        const steps = ids[column].slice(DECODE_CONTEXT);
        const t0 = performance.now();
        for (const t of steps) ctx.eval([t]);
        return steps.length / ((performance.now() - t0) / 1000);
      }
      const t0 = performance.now();
      ctx.eval(ids[column]);
      return ids[column].length / ((performance.now() - t0) / 1000);
    },
    idle: () => ctx.pause(),
  };
}

/**
 * Alternating rounds over variants (start rotated each round); each variant measures its own
 * columns every round. Returns medians (a variant's unmeasured columns are absent).
 */
async function alternate(
  variants: { v: Variant; columns: readonly Column[] }[],
  ids: Record<Column, number[]>,
  runs: number,
  perRound?: Map<string, Map<Column, number[]>>,
): Promise<Record<string, Partial<Rates>>> {
  const samples = new Map<string, Map<Column, number[]>>();
  for (const { v, columns } of variants) {
    samples.set(v.name, new Map(columns.map((c) => [c, []])));
  }
  for (let r = 0; r < runs; r++) {
    for (let i = 0; i < variants.length; i++) {
      const { v, columns } = variants[(i + r) % variants.length];
      for (const c of columns) samples.get(v.name)!.get(c)!.push(await v.measure(c, ids));
      v.idle();
    }
  }
  for (const [name, cols] of samples) perRound?.set(name, cols);
  const out: Record<string, Partial<Rates>> = {};
  for (const [name, cols] of samples) {
    out[name] = Object.fromEntries([...cols].map(([c, xs]) => [c, median(xs)]));
  }
  return out;
}

/** 2-D weight values read per decoded token: every layer's matrices and the output head. */
function weightsPerToken(cfg: LoadedModel["checkpoint"]["config"]): number {
  const h = cfg.hiddenSize, d = cfg.headDim, f = cfg.intermediateSize;
  const q = cfg.numHeads * d, kv = cfg.numKvHeads * d;
  const layer = h * q + 2 * h * kv + q * h + 3 * h * f;
  return cfg.numLayers * layer + cfg.vocabSize * h;
}

async function loadKvrelay(dir: string, threads: number, kvDtype: KvDtype, weights?: string) {
  const opts = { threads, kvDtype, ...(weights ? { weights } : {}) } as NativeModelOptions;
  return await loadModel(dir, opts);
}

async function benchModel(
  lib: LlamaCpp,
  dir: string,
  realSize: boolean,
  opts: PeersOptions,
  bandwidth: number,
  log: (line: string) => void,
): Promise<PeersModelResult> {
  const name = dir.split("/").filter(Boolean).pop()!;
  const loadBefore = await loadAverage();
  const runs = realSize ? opts.realRuns : opts.runs;
  const formats = WEIGHT_FORMATS.filter((f) =>
    !(realSize && f.demoOnly) && (!opts.formats || opts.formats.includes(f.name))
  );
  const configs = realSize ? LLAMA_CONFIGS.filter((c) => c.kvType === "f16") : LLAMA_CONFIGS;
  const cols: readonly Column[] = opts.columns ?? ALL;
  const base = await loadCheckpoint(dir);
  const vocab = base.config.vocabSize;
  const params = [...base.tensors.values()].reduce(
    (a, t) => a + t.shape.reduce((x, y) => x * y, 1),
    0,
  );
  const ids: Record<Column, number[]> = {
    prefill128: promptIds(128, vocab, 1),
    prefill512: promptIds(512, vocab, 2),
    prefill2048: promptIds(2048, vocab, 3),
    "decode@512": promptIds(DECODE_CONTEXT + DECODE_STEPS, vocab, 4),
  };
  const sample = await Deno.readTextFile(`${root}tests/data/valid-sample.txt`);
  let reference:
    | { format: string; logits: Float32Array[]; prompt: number[]; next: number[] }
    | null = null;
  let bf16WeightBytes = 0;
  const results: PeersFormatResult[] = [];
  for (const fmt of formats) {
    log(`${name} ${fmt.name}: converting / loading`);
    const gguf = await ggufFor(dir, fmt.gguf);
    const ggufBytes = (await Deno.stat(gguf)).size;
    // kvrelay side
    let km: LoadedModel | null = null;
    let kvrelayNote: string | undefined;
    let kvrelayRss: number | undefined;
    const before = await rss();
    try {
      const kdir = fmt.kvrelay.copyF32 ? await f32CopyFor(dir) : dir;
      km = await loadKvrelay(kdir, opts.threads, opts.kvrelayKv ?? "f32", fmt.kvrelay.weights);
      const limit = fmt.kvrelay.maxWeightRatioToBf16;
      const bf16Bytes = bf16WeightBytes || 2 * params;
      if (limit !== undefined && km.native.weightBytes > limit * bf16Bytes) {
        kvrelayNote =
          `kvrelay has no "${fmt.kvrelay.weights}" weights yet (weights ${km.native.weightBytes} B, not below ${limit} × bf16 ${bf16Bytes} B)`;
        km.native.free();
        km = null;
      }
    } catch (e) {
      kvrelayNote = `kvrelay cannot load ${fmt.name}: ${(e as Error).message.split("\n")[0]}`;
      km = null;
    }
    if (kvrelayNote) log(`  ${kvrelayNote}`);
    if (km && fmt.name === "bf16") bf16WeightBytes = km.native.weightBytes;
    // reference path: the first (most exact) format kvrelay runs
    if (km && reference === null) {
      const prompt = km.tokenizer.encode(sample).slice(0, CHECK_PROMPT_TOKENS);
      const next: number[] = [];
      const seq = km.native.createSequence(prompt.length + CHECK_DECODE_STEPS + 1);
      try {
        const logits = [await seq.prefill(prompt)];
        for (let s = 0; s < CHECK_DECODE_STEPS; s++) {
          next.push(argmax(logits[logits.length - 1]));
          logits.push(await seq.decode(next[s]));
        }
        const kv = opts.kvrelayKv ?? "f32";
        reference = {
          format: kv === "f32" ? fmt.name : `${fmt.name} (KV ${kv})`,
          logits,
          prompt,
          next,
        };
      } finally {
        seq.free();
      }
    }
    if (reference === null) throw new Error(`${name}: kvrelay runs no format; no reference`);
    const kvrelayLogits = km ? await kvrelayPath(km, reference.prompt, reference.next) : null;
    if (km) kvrelayRss = (await rss()).rss - before.rss;
    // llama.cpp side
    const beforeLlama = await rss();
    const lm: LlamaModel = lib.loadModel(gguf);
    const contexts: LlamaContext[] = [];
    try {
      const check = lm.createContext({
        nCtx: 256,
        threads: opts.threads,
        flashAttn: false,
        kvType: "f32",
      });
      const llamaLogits = llamaPath(check, reference.prompt, reference.next);
      check.free();
      const llamaRss = (await rss()).rss - beforeLlama.rss;
      const quality: PeersFormatResult["quality"] = {
        reference: `kvrelay ${reference.format}`,
        llamaCpp: agreement(llamaLogits, reference.logits),
      };
      if (kvrelayLogits) {
        quality.kvrelay = agreement(kvrelayLogits, reference.logits);
        quality.llamaVsKvrelay = agreement(llamaLogits, kvrelayLogits);
      }
      const vs = quality.llamaVsKvrelay;
      log(
        `  logits: llama.cpp vs kvrelay ${
          vs ? `${vs.worstRelMaxDiff.toExponential(2)} rel, top-1 ${vs.top1Agree}` : "n/a"
        }; vs reference (${quality.reference}): kvrelay ${
          quality.kvrelay?.worstRelMaxDiff.toExponential(2) ?? "n/a"
        }, llama.cpp ${quality.llamaCpp.worstRelMaxDiff.toExponential(2)}`,
      );
      if (fmt.name === "f32") {
        if (!vs) throw new Error(`${name} f32: kvrelay did not run f32 weights`);
        const [agree, total] = vs.top1Agree.split("/");
        if (!(vs.worstRelMaxDiff <= F32_TOLERANCE) || agree !== total) {
          throw new Error(
            `${name}: llama.cpp and kvrelay disagree on f32 weights: relative logit difference ${vs.worstRelMaxDiff} (limit ${F32_TOLERANCE}), top-1 ${vs.top1Agree}. Refusing to compare speed.`,
          );
        }
      }
      for (const c of configs) {
        contexts.push(
          lm.createContext({ nCtx: 2048 + 64, ...c, threads: c.threads ?? opts.threads }),
        );
      }
      // Screening: one round of every llama.cpp configuration; the fastest per column is then
      // timed against kvrelay in alternating rounds ("llama.cpp best").
      const llamaVariants = contexts.map((ctx, i) => llamaVariant(ctx, configName(configs[i])));
      log(`  screening llama.cpp ${llamaVariants.map((v) => v.name).join(" | ")}`);
      const screen = await alternate(
        llamaVariants.map((v) => ({ v, columns: cols })),
        ids,
        1,
      );
      const candidates = Object.entries(screen);
      const bestConfig = Object.fromEntries(cols.map((c) => [
        c,
        candidates.sort((a, b) => b[1][c]! - a[1][c]!)[0][0],
      ])) as Record<Column, string>;
      const timed = [
        ...(km ? [{ v: kvrelayVariant(km), columns: cols }] : []),
        ...llamaVariants.flatMap((v) => {
          const columns = cols.filter((c) => bestConfig[c] === v.name);
          return columns.length ? [{ v, columns }] : [];
        }),
      ];
      log(
        `  timing ${
          timed.map((t) => `${t.v.name} [${t.columns.join(",")}]`).join(" | ")
        } × ${runs} rounds`,
      );
      const perRound = new Map<string, Map<Column, number[]>>();
      const rates = await alternate(timed, ids, runs, perRound);
      const llamaCpp = screen as Record<string, Rates>;
      const llamaBest = Object.fromEntries(cols.map((c) => [c, {
        tokensPerSecond: rates[bestConfig[c]][c]!,
        config: bestConfig[c],
      }])) as PeersFormatResult["llamaBest"];
      const kv = rates.kvrelay as Rates | undefined;
      const perToken = weightsPerToken(base.config) * fmt.bytesPerWeight;
      const floorRate = bandwidth / perToken;
      results.push({
        format: fmt.name,
        kvrelaySupported: km !== null,
        kvrelayNote,
        ggufBytes,
        quality,
        memory: {
          kvrelayWeightBytes: km?.native.weightBytes,
          kvrelayRssDeltaBytes: kvrelayRss,
          llamaModelBytes: lm.sizeBytes,
          llamaRssDeltaBytes: llamaRss,
        },
        kvrelay: kv,
        llamaCpp,
        llamaBest,
        rounds: kv
          ? Object.fromEntries(cols.map((c) => {
            const k = perRound.get("kvrelay")!.get(c)!, l = perRound.get(bestConfig[c])!.get(c)!;
            return [c, { kvrelay: k, llamaBest: l }];
          })) as PeersFormatResult["rounds"]
          : undefined,
        ratio: kv
          ? Object.fromEntries(
            cols.map((c) => [c, kv[c] / llamaBest[c].tokensPerSecond]),
          ) as Record<
            Column,
            number
          >
          : undefined,
        floor: cols.includes("decode@512")
          ? {
            weightBytesPerToken: perToken,
            tokensPerSecond: floorRate,
            kvrelay: kv ? kv["decode@512"] / floorRate : undefined,
            llama: llamaBest["decode@512"].tokensPerSecond / floorRate,
          }
          : undefined,
      });
    } finally {
      for (const c of contexts) c.free();
      lm.free();
      km?.native.free();
    }
  }
  // best vs best: kvrelay's fastest supported format vs llama.cpp's fastest format and config
  const measured = results.filter((r) => r.kvrelay);
  const bestVsBest = measured.length
    ? Object.fromEntries(cols.map((c) => {
      const k = measured.sort((a, b) => b.kvrelay![c] - a.kvrelay![c])[0];
      const l = [...results].sort((a, b) =>
        b.llamaBest[c].tokensPerSecond - a.llamaBest[c].tokensPerSecond
      )[0];
      return [c, {
        ratio: k.kvrelay![c] / l.llamaBest[c].tokensPerSecond,
        kvrelay: k.format,
        llama: `${l.format} ${l.llamaBest[c].config}`,
      }];
    })) as PeersModelResult["bestVsBest"]
    : undefined;
  return {
    model: name,
    realSize,
    params,
    runs,
    loadAverage: [loadBefore, await loadAverage()],
    formats: results,
    bestVsBest,
  };
}

/**
 * Runs the peers section.
 * @param opts models, threads, rounds
 * @param log progress lines (stderr by default)
 * @returns results for every model and format
 * @throws Error when llama.cpp and kvrelay disagree on f32 weights
 */
export async function benchPeers(
  opts: PeersOptions,
  log: (line: string) => void = (l) => console.error(l),
): Promise<PeersResult> {
  const lib = await LlamaCpp.load();
  log(`llama.cpp: ${lib.cpuBackend}; ${lib.systemInfo}`);
  const bandwidth = [];
  for (const t of [...new Set([1, opts.threads])]) bandwidth.push(await copyBandwidth(t));
  const bw = bandwidth[bandwidth.length - 1].bytesPerSecond;
  log(
    `copy bandwidth: ${
      bandwidth.map((b) => `${b.threads} thread(s) ${(b.bytesPerSecond / 1e9).toFixed(1)} GB/s`)
        .join(", ")
    }`,
  );
  const cpuinfo = await Deno.readTextFile("/proc/cpuinfo").catch(() => "");
  const flags = new Set((cpuinfo.match(/^flags\s*:\s*(.*)$/m)?.[1] ?? "").split(/\s+/));
  const models = [];
  for (const m of opts.models) {
    models.push(await benchModel(lib, m.dir, m.realSize, opts, bw, log));
  }
  return {
    threads: opts.threads,
    columns: [...(opts.columns ?? COLUMNS)],
    llamaCpp: {
      nodeLlamaCppVersion: NODE_LLAMA_CPP_VERSION,
      systemInfo: lib.systemInfo,
      cpuBackend: lib.cpuBackend,
      configs: LLAMA_CONFIGS.map(configName),
    },
    cpuFlags: [...flags].filter((f) => /^(avx|fma|f16c|amx)/.test(f)).sort(),
    copyBandwidth: bandwidth.map((b) => ({ threads: b.threads, bytesPerSecond: b.bytesPerSecond })),
    kvrelayKv: opts.kvrelayKv ?? "f32",
    models,
  };
}

const fmtRate = (x: number) => x >= 100 ? x.toFixed(0) : x.toFixed(1);

/**
 * Formats the peers section: per model and format the rates and ratios, then the ratio summary.
 * @param r the result
 * @returns printable lines
 */
export function formatPeersTable(r: PeersResult): string {
  const lines = [
    `llama.cpp (node-llama-cpp ${r.llamaCpp.nodeLlamaCppVersion} prebuilt, ${r.llamaCpp.cpuBackend}): ${r.llamaCpp.systemInfo}`,
    `threads ${r.threads}; copy bandwidth ${
      r.copyBandwidth.map((b) => `${b.threads}T ${(b.bytesPerSecond / 1e9).toFixed(1)} GB/s`).join(
        ", ",
      )
    }; kvrelay KV cache ${
      r.kvrelayKv ?? "f32"
    }; tokens/s, medians; ratio = kvrelay / llama.cpp best`,
    "",
    `${"model".padEnd(14)} ${"fmt".padEnd(5)} ${"engine".padEnd(22)} ${
      r.columns.map((c) => c.padStart(12)).join("")
    }`,
  ];
  for (const m of r.models) {
    for (const f of m.formats) {
      if (f === m.formats[0]) {
        lines.push(`${m.model}: ${m.runs} rounds, load average ${m.loadAverage.join(" → ")}`);
      }
      const row = (label: string, vals: string[]) =>
        lines.push(
          `${m.model.padEnd(14)} ${f.format.padEnd(5)} ${label.padEnd(22)} ${
            vals.map((v) => v.padStart(12)).join("")
          }`,
        );
      if (f.kvrelay) row("kvrelay", r.columns.map((c) => fmtRate(f.kvrelay![c])));
      else row("kvrelay", r.columns.map(() => "—"));
      for (const [cfg, rates] of Object.entries(f.llamaCpp)) {
        row(`  screen ${cfg}`, r.columns.map((c) => fmtRate(rates[c])));
      }
      row("llama.cpp best", r.columns.map((c) => fmtRate(f.llamaBest[c].tokensPerSecond)));
      if (f.ratio) row("ratio vs best", r.columns.map((c) => f.ratio![c].toFixed(2)));
      if (f.rounds) {
        // per-round ratios (round r of kvrelay / round r of llama.cpp best): the noise of one round
        const span = (c: Column) => {
          const { kvrelay: k, llamaBest: l } = f.rounds![c];
          const q = k.map((x, i) => x / l[i]);
          return `${Math.min(...q).toFixed(2)}-${Math.max(...q).toFixed(2)}`;
        };
        row("  per-round ratio", r.columns.map(span));
      }
    }
  }
  lines.push("", "kvrelay / llama.cpp best, same weight format:");
  lines.push(
    `${"model".padEnd(14)} ${"fmt".padEnd(5)} ${r.columns.map((c) => c.padStart(12)).join("")}`,
  );
  for (const m of r.models) {
    for (const f of m.formats) {
      lines.push(
        `${m.model.padEnd(14)} ${f.format.padEnd(5)} ${
          r.columns.map((c) => (f.ratio ? f.ratio[c].toFixed(2) : "—").padStart(12)).join("")
        }${f.kvrelaySupported ? "" : "   (kvrelay: not supported)"}`,
      );
    }
  }
  lines.push("", "kvrelay best format / llama.cpp best format and config:");
  for (const m of r.models) {
    if (!m.bestVsBest) continue;
    lines.push(
      `${m.model.padEnd(20)} ${
        r.columns.map((c) => m.bestVsBest![c].ratio.toFixed(2).padStart(12)).join("")
      }   (llama.cpp best: ${r.columns.map((c) => m.bestVsBest![c].llama).join("; ")})`,
    );
  }
  lines.push("", "quality (logits, teacher-forced path; worst relative max difference, top-1):");
  for (const m of r.models) {
    for (const f of m.formats) {
      const q = f.quality;
      lines.push(
        `${m.model.padEnd(14)} ${f.format.padEnd(5)} vs ${q.reference}: kvrelay ${
          q.kvrelay ? `${q.kvrelay.worstRelMaxDiff.toExponential(1)} ${q.kvrelay.top1Agree}` : "—"
        }, llama.cpp ${q.llamaCpp.worstRelMaxDiff.toExponential(1)} ${q.llamaCpp.top1Agree}${
          q.llamaVsKvrelay
            ? `; llama.cpp vs kvrelay ${
              q.llamaVsKvrelay.worstRelMaxDiff.toExponential(1)
            } ${q.llamaVsKvrelay.top1Agree}`
            : ""
        }`,
      );
    }
  }
  const real = r.models.filter((m) => m.realSize);
  if (real.length) {
    lines.push("", "real-size shapes: resident memory and decode vs the memory-bandwidth floor");
    for (const m of real) {
      for (const f of m.formats) {
        if (!f.floor) continue;
        const mem = f.memory;
        const mb = (x?: number) => x === undefined ? "—" : `${(x / 2 ** 20).toFixed(0)} MiB`;
        lines.push(
          `${m.model.padEnd(14)} ${f.format.padEnd(5)} gguf ${mb(f.ggufBytes)}; kvrelay weights ${
            mb(mem.kvrelayWeightBytes)
          } (RSS +${mb(mem.kvrelayRssDeltaBytes)}); llama.cpp weights ${
            mb(mem.llamaModelBytes)
          } (RSS +${mb(mem.llamaRssDeltaBytes)}); floor ${
            f.floor!.tokensPerSecond.toFixed(1)
          } tok/s (${(f.floor!.weightBytesPerToken / 2 ** 20).toFixed(0)} MiB/token): kvrelay ${
            f.floor!.kvrelay === undefined ? "—" : `${(100 * f.floor!.kvrelay).toFixed(0)}%`
          }, llama.cpp ${(100 * f.floor!.llama).toFixed(0)}%`,
        );
      }
    }
  }
  return lines.join("\n");
}
