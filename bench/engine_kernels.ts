// Engine benchmark, quantized-weight kernel rows: decode tokens/s at 1 thread for q8 and q4 weights
// on every q8/q4 kernel path this CPU can run (the default choice, then AVX-VNNI, AVX2 and the
// portable kernels, each on models loaded with that kernel cap: NativeModel.load's cpuKernel).
// Not the main engine table (bench/engine.ts), which runs the default kernels only.
import { loadModel } from "../lib/engine/mod.ts";
import type { CpuKernel, WeightFormat } from "../lib/native/mod.ts";
import { median } from "./machine.ts";

const DECODE_CONTEXT = 512;
const DECODE_STEPS = 32;
const RUNS = 3;
const FORMATS: WeightFormat[] = ["q8", "q4"];

/** One row: a model's 1-thread decode with one weight format on one kernel path. */
export interface QuantKernelRow {
  model: string;
  weights: WeightFormat;
  /** the kernel cap the model was loaded with ("auto" = every path the CPU has) */
  forced: CpuKernel;
  /** the kernel the library reported for this format (from the model's device description) */
  kernel: string;
  decodeTokensPerSecond: number;
}

/** Kernel caps whose q8/q4 path differs on this CPU (/proc/cpuinfo flags). */
async function forcedPaths(): Promise<CpuKernel[]> {
  const text = await Deno.readTextFile("/proc/cpuinfo").catch(() => "");
  const flags = new Set(text.split("\n").find((l) => l.startsWith("flags"))?.split(/\s+/) ?? []);
  const out: CpuKernel[] = ["auto"];
  if (flags.has("avx_vnni") && flags.has("avx512_vnni")) out.push("avxvnni");
  if (flags.has("avx2") && flags.has("fma") && flags.has("f16c")) out.push("avx2");
  out.push("generic");
  return out;
}

function promptIds(n: number, vocab: number): number[] {
  let state = 12345;
  return Array.from({ length: n }, () => {
    state = (state * 1103515245 + 12345) >>> 0;
    return state % vocab;
  });
}

function argmax(xs: Float32Array): number {
  let best = 0;
  for (let i = 1; i < xs.length; i++) if (xs[i] > xs[best]) best = i;
  return best;
}

/** Median decode tokens/s at context 512, 1 thread, per model and format, under one cap. */
async function capRows(dirs: string[], forced: CpuKernel): Promise<QuantKernelRow[]> {
  const rows: QuantKernelRow[] = [];
  for (const dir of dirs) {
    for (const weights of FORMATS) {
      const model = await loadModel(dir, { threads: 1, weights, cpuKernel: forced });
      try {
        const vocab = model.checkpoint.config.vocabSize;
        const times: number[] = [];
        for (let r = 0; r < RUNS; r++) {
          const seq = model.native.createSequence(DECODE_CONTEXT + DECODE_STEPS);
          try {
            let logits = await seq.prefill(promptIds(DECODE_CONTEXT, vocab));
            const t0 = performance.now();
            for (let i = 0; i < DECODE_STEPS; i++) logits = await seq.decode(argmax(logits));
            times.push((performance.now() - t0) / 1000);
          } finally {
            seq.free();
          }
        }
        const kernel = new RegExp(`${weights} ([a-z0-9-]+)`).exec(model.native.deviceInfo)?.[1] ??
          "?";
        rows.push({
          model: model.name,
          weights,
          forced,
          kernel,
          decodeTokensPerSecond: DECODE_STEPS / median(times),
        });
      } finally {
        model.native.free();
      }
    }
  }
  return rows;
}

/**
 * Runs the kernel rows: models loaded with each kernel cap in turn.
 * @param modelDirs Model directories to measure.
 * @returns One row per model, format and kernel path.
 */
export async function benchQuantKernels(modelDirs: string[]): Promise<QuantKernelRow[]> {
  const rows: QuantKernelRow[] = [];
  for (const forced of await forcedPaths()) rows.push(...await capRows(modelDirs, forced));
  return rows;
}

/**
 * Formats the kernel rows as a fixed-width table.
 * @param rows The rows.
 * @returns Printable lines.
 */
export function formatQuantKernelTable(rows: QuantKernelRow[]): string {
  const lines = ["model          weights forced    kernel        threads  decode@512 (tokens/s)"];
  for (const r of rows) {
    lines.push(
      `${r.model.padEnd(14)} ${r.weights.padEnd(7)} ${r.forced.padEnd(9)} ${r.kernel.padEnd(13)} ${
        "1".padStart(7)
      } ${r.decodeTokensPerSecond.toFixed(1).padStart(11)}`,
    );
  }
  return lines.join("\n");
}
