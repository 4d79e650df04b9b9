// Test-only helpers for lib/native tests: deterministic token streams, logits comparison, a
// cached demo-model loader and the test library's CPU kernel selection (withCpuKernel). Not
// imported by production code.

import { type Checkpoint, loadCheckpoint } from "../model/mod.ts";
import { type CpuKernel, setCpuKernel } from "./gemm.ts";
import { openTestLibrary, type TestLibrary } from "./test_library.ts";

/** Demo model directories (absolute). */
export const DEMO_DIRS = ["tiny-fast", "tiny-balanced", "tiny-powerful"].map((m) =>
  new URL(`../../models/${m}`, import.meta.url).pathname
);

const cache = new Map<string, Promise<Checkpoint>>();
/** loadCheckpoint, memoized per directory within one test file. */
export function checkpoint(dir: string): Promise<Checkpoint> {
  let p = cache.get(dir);
  if (!p) cache.set(dir, p = loadCheckpoint(dir));
  return p;
}

/** n pseudo-random token ids in [0, vocab) from a 32-bit LCG seeded by `seed`. */
export function tokens(n: number, vocab: number, seed: number): number[] {
  let s = seed >>> 0;
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out.push(s % vocab);
  }
  return out;
}

/** max |a-b| / max |b| over two equal-length vectors. */
export function relDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length ${a.length} vs ${b.length}`);
  let diff = 0, scale = 0;
  for (let i = 0; i < a.length; i++) {
    diff = Math.max(diff, Math.abs(a[i] - b[i]));
    scale = Math.max(scale, Math.abs(b[i]));
  }
  return diff / Math.max(scale, 1e-30);
}

/** Asserts relDiff(a, b) <= tol with a message naming the case. */
export function assertClose(
  a: ArrayLike<number>,
  b: ArrayLike<number>,
  tol: number,
  what: string,
): void {
  const d = relDiff(a, b);
  if (!(d <= tol)) throw new Error(`${what}: relative difference ${d.toExponential(3)} > ${tol}`);
}

/** Round-to-nearest-even f32 → bf16 bit pattern (plain reference; NaN kept quiet). */
export function f32ToBf16Bits(x: number): number {
  const u = new Uint32Array(new Float32Array([x]).buffer)[0];
  if ((u & 0x7fffffff) > 0x7f800000) return (u >>> 16) | 0x40;
  const rounded = u + 0x7fff + ((u >>> 16) & 1);
  return (rounded >>> 16) & 0xffff;
}

/** The CPU flags of /proc/cpuinfo (empty where it does not exist): the tests' oracle for which
 *  kernels the library must choose, independent of its own detection. */
export function cpuFlags(): Set<string> {
  let text = "";
  try {
    text = Deno.readTextFileSync("/proc/cpuinfo");
  } catch {
    // no /proc: no flags
  }
  return new Set(text.match(/^flags\s*:(.*)$/m)?.[1].split(/\s+/).filter((f) => f) ?? []);
}

/** The kernel selections (kvr_test_set_cpu_kernel) this CPU can run, per its flags. */
export function cpuKernels(): Exclude<CpuKernel, "">[] {
  const f = cpuFlags();
  const avx2 = f.has("avx2") && f.has("fma");
  const out: Exclude<CpuKernel, "">[] = ["generic"];
  if (avx2) out.push("avx2");
  if (avx2 && f.has("f16c") && f.has("avx_vnni")) out.push("avxvnni");
  if (avx2 && f.has("avx512f")) out.push("avx512");
  return out;
}

/** The q8/q4 kernel each narrowing selection must choose on this CPU (/proc/cpuinfo flags), for
 *  the forced paths the CPU can run: each is compared with the default in the same process. */
export function forcedQuantKernels(): { force: Exclude<CpuKernel, "">; name: string }[] {
  const flags = cpuFlags();
  const out: { force: Exclude<CpuKernel, "">; name: string }[] = [{
    force: "generic",
    name: "generic",
  }];
  if (flags.has("avx2") && flags.has("fma") && flags.has("f16c")) {
    out.push({ force: "avx2", name: "avx2" });
    if (flags.has("avx_vnni")) out.push({ force: "avxvnni", name: "avx-vnni" });
  }
  return out;
}

/** The selection this process started with: the environment's KVRELAY_CPU_KERNEL when it names
 *  a path this CPU runs (the library ignores any other value), else "" (the CPU's best). */
export function initialCpuKernel(): CpuKernel {
  let env: string | undefined;
  try {
    env = Deno.env.get("KVRELAY_CPU_KERNEL");
  } catch {
    env = undefined; // no --allow-env
  }
  return (cpuKernels() as string[]).includes(env ?? "") ? env as CpuKernel : "";
}

/**
 * Runs fn with the test library's CPU kernel selection set to `kernel`, then restores the
 * process's initial selection (try/finally), so the other tests of the file see the default.
 * Models whose results should follow the selection must be loaded from the same test library
 * (each library has its own selection); weight packing does not depend on it.
 * @param kernel the selection ("" = the CPU's best)
 * @param fn the checks to run
 * @param lib test library (default openTestLibrary())
 * @returns fn's result
 */
export async function withCpuKernel<T>(
  kernel: CpuKernel,
  fn: () => T | Promise<T>,
  lib: TestLibrary = openTestLibrary(),
): Promise<T> {
  setCpuKernel(kernel, lib);
  try {
    return await fn();
  } finally {
    setCpuKernel(initialCpuKernel(), lib);
  }
}
