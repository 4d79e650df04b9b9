// Engine benchmark: prefill tokens/s at several prompt lengths and decode tokens/s at a fixed
// context for each demo model at 1 thread and all cores (bf16 weights as stored; q8 and q4 at all
// cores), 1-thread q8/q4 decode on every quantized-kernel path the CPU has (engine_kernels.ts),
// plus the native GEMM against the machine's fp32 FMA peak.
// Medians over repeated runs; prompts are deterministic pseudo-random token ids.
import { loadModel } from "../lib/engine/mod.ts";
import type { WeightFormat } from "../lib/native/mod.ts";
import { cpuKernelName, gemmBench } from "../lib/native/gemm.ts";
import {
  benchQuantKernels,
  formatQuantKernelTable,
  type QuantKernelRow,
} from "./engine_kernels.ts";
import { fp32PeakGflops, machineInfo, median } from "./machine.ts";

const PREFILL_LENGTHS = [128, 512, 2048];
const DECODE_CONTEXT = 512;
const DECODE_STEPS = 32;
const RUNS = 3;

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

/** One model's rows of the engine table. */
export interface EngineModelResult {
  model: string;
  threads: number;
  /** linear-weight format in memory */
  weights: WeightFormat;
  prefillTokensPerSecond: Record<string, number>;
  decodeTokensPerSecond: number;
  decodeContext: number;
  /** every run's tokens/s (the medians above are of these), for the result file's spread */
  runs: { prefill: Record<string, number[]>; decode: number[] };
}

async function benchModel(
  dir: string,
  threads: number,
  weights: WeightFormat,
): Promise<EngineModelResult> {
  const model = await loadModel(dir, { threads, weights });
  try {
    const vocab = model.checkpoint.config.vocabSize;
    const prefill: Record<string, number> = {};
    const prefillRuns: Record<string, number[]> = {};
    for (const n of PREFILL_LENGTHS) {
      const ids = promptIds(n, vocab);
      const times: number[] = [];
      for (let r = 0; r < RUNS; r++) {
        const seq = model.native.createSequence(n);
        try {
          const t0 = performance.now();
          await seq.prefill(ids);
          times.push((performance.now() - t0) / 1000);
        } finally {
          seq.free();
        }
      }
      prefill[String(n)] = n / median(times);
      prefillRuns[String(n)] = times.map((t) => n / t);
    }
    const decodeTimes: number[] = [];
    for (let r = 0; r < RUNS; r++) {
      const seq = model.native.createSequence(DECODE_CONTEXT + DECODE_STEPS);
      try {
        let logits = await seq.prefill(promptIds(DECODE_CONTEXT, vocab));
        const t0 = performance.now();
        for (let i = 0; i < DECODE_STEPS; i++) logits = await seq.decode(argmax(logits));
        decodeTimes.push((performance.now() - t0) / 1000);
      } finally {
        seq.free();
      }
    }
    return {
      model: model.name,
      threads: model.native.threads,
      weights,
      prefillTokensPerSecond: prefill,
      decodeTokensPerSecond: DECODE_STEPS / median(decodeTimes),
      decodeContext: DECODE_CONTEXT,
      runs: { prefill: prefillRuns, decode: decodeTimes.map((t) => DECODE_STEPS / t) },
    };
  } finally {
    model.native.free();
  }
}

/** Result of the engine section. */
export interface EngineBenchResult {
  models: EngineModelResult[];
  /** 1-thread q8/q4 decode per kernel path (default, avxvnni, avx2, generic) */
  quantKernels: QuantKernelRow[];
  gemm: {
    kernel: string;
    shape: [number, number, number];
    threads: number;
    gflops: number;
    peakGflops: number | null;
    ratioToPeak: number | null;
  }[];
}

/**
 * Runs the engine section.
 * @param modelDirs Demo model directories to measure.
 * @returns Medians per model and GEMM throughput for 1 and all threads.
 */
export async function benchEngine(modelDirs: string[]): Promise<EngineBenchResult> {
  const info = await machineInfo();
  const threads = info.logicalCpus;
  const models: EngineModelResult[] = [];
  // 1 thread and all cores with the checkpoint's weights (shows how decode scales with threads),
  // then q8 and q4 at all cores.
  for (const dir of modelDirs) {
    for (const t of [...new Set([1, threads])]) models.push(await benchModel(dir, t, "bf16"));
    models.push(await benchModel(dir, threads, "q8"));
    models.push(await benchModel(dir, threads, "q4"));
  }
  const quantKernels = await benchQuantKernels(modelDirs);
  const gemm = [];
  for (const t of [...new Set([1, threads])]) {
    const m = 1024, n = 1024, k = 1024;
    const seconds = gemmBench(m, n, k, t, 7);
    const gflops = (2 * m * n * k) / seconds / 1e9;
    const peak = fp32PeakGflops(info, t);
    gemm.push({
      kernel: cpuKernelName(),
      shape: [m, n, k] as [number, number, number],
      threads: t,
      gflops,
      peakGflops: peak,
      ratioToPeak: peak === null ? null : gflops / peak,
    });
  }
  return { models, quantKernels, gemm };
}

/**
 * Formats the engine section as a fixed-width table.
 * @param r The engine result.
 * @returns Printable lines.
 */
export function formatEngineTable(r: EngineBenchResult): string {
  const lines = [
    "model          weights threads  prefill128  prefill512  prefill2048  decode@512   (tokens/s)",
  ];
  for (const m of r.models) {
    const p = m.prefillTokensPerSecond;
    lines.push(
      `${m.model.padEnd(14)} ${m.weights.padEnd(7)} ${String(m.threads).padStart(7)} ${
        p["128"].toFixed(0).padStart(11)
      } ${p["512"].toFixed(0).padStart(11)} ${p["2048"].toFixed(0).padStart(12)} ${
        m.decodeTokensPerSecond.toFixed(1).padStart(11)
      }`,
    );
  }
  lines.push(formatQuantKernelTable(r.quantKernels ?? []));
  for (const g of r.gemm) {
    lines.push(
      `gemm ${g.shape.join("x")} ${g.kernel} threads=${g.threads}: ${g.gflops.toFixed(1)} GFLOP/s` +
        (g.ratioToPeak === null
          ? ""
          : ` = ${(100 * g.ratioToPeak).toFixed(1)}% of ${g.peakGflops!.toFixed(1)} GFLOP/s peak`),
    );
  }
  return lines.join("\n");
}
