// Engine benchmark, quantized-weight kernel rows: decode tokens/s at 1 thread for q8 and q4 weights
// on every q8/q4 kernel path this CPU can run (the default choice, then AVX-VNNI, AVX2 and the
// portable kernels forced by KVRELAY_CPU_KERNEL). The kernel is chosen once per process, so each
// path runs in a child process (this file with --child); the parent collects the rows.
// Not the main engine table (bench/engine.ts), which runs the default kernels only.
import { loadModel } from "../lib/engine/mod.ts";
import { probeBackend, type WeightFormat } from "../lib/native/mod.ts";
import { median } from "./machine.ts";

const DECODE_CONTEXT = 512;
const DECODE_STEPS = 32;
const RUNS = 3;
const FORMATS: WeightFormat[] = ["q8", "q4"];

/** One row: a model's 1-thread decode with one weight format on one kernel path. */
export interface QuantKernelRow {
  model: string;
  weights: WeightFormat;
  /** KVRELAY_CPU_KERNEL value ("default" = unset) */
  forced: string;
  /** the kernel the library reported for this format (from the CPU probe string) */
  kernel: string;
  decodeTokensPerSecond: number;
}

/** KVRELAY_CPU_KERNEL values whose q8/q4 path differs on this CPU (/proc/cpuinfo flags). */
async function forcedPaths(): Promise<string[]> {
  const text = await Deno.readTextFile("/proc/cpuinfo").catch(() => "");
  const flags = new Set(text.split("\n").find((l) => l.startsWith("flags"))?.split(/\s+/) ?? []);
  const out = ["default"];
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

/** In the child: median decode tokens/s at context 512, 1 thread, per model and format. */
async function childRows(dirs: string[], forced: string): Promise<QuantKernelRow[]> {
  const info = probeBackend("cpu").info;
  const rows: QuantKernelRow[] = [];
  for (const dir of dirs) {
    for (const weights of FORMATS) {
      const model = await loadModel(dir, { threads: 1, weights });
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
        const kernel = new RegExp(`${weights} ([a-z0-9-]+)`).exec(info)?.[1] ?? "?";
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
 * Runs the kernel rows: one child process per kernel path.
 * @param modelDirs Model directories to measure.
 * @returns One row per model, format and kernel path.
 */
export async function benchQuantKernels(modelDirs: string[]): Promise<QuantKernelRow[]> {
  const rows: QuantKernelRow[] = [];
  for (const forced of await forcedPaths()) {
    const env: Record<string, string> = { NO_COLOR: "1" };
    if (forced !== "default") env.KVRELAY_CPU_KERNEL = forced;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", import.meta.filename!, "--child", forced, ...modelDirs],
      env,
      stdout: "piped",
      stderr: "inherit",
    }).output();
    if (!out.success) throw new Error(`kernel path ${forced}: child exited with ${out.code}`);
    const text = new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!;
    rows.push(...JSON.parse(text) as QuantKernelRow[]);
  }
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

if (import.meta.main && Deno.args[0] === "--child") {
  const [, forced, ...dirs] = Deno.args;
  console.log(JSON.stringify(await childRows(dirs, forced)));
}
