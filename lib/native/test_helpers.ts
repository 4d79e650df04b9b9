// Test-only helpers for lib/native tests: deterministic token streams, logits comparison and a
// cached demo-model loader. Not imported by production code.

import { type Checkpoint, loadCheckpoint } from "../model/mod.ts";

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

/** The q8/q4 kernel each KVRELAY_CPU_KERNEL value must select on this CPU (/proc/cpuinfo flags),
 *  for the forced paths the CPU can run: children forced to each compare with the default. */
export async function forcedQuantKernels(): Promise<{ force: string; name: string }[]> {
  const text = await Deno.readTextFile("/proc/cpuinfo").catch(() => "");
  const flags = new Set(text.split("\n").find((l) => l.startsWith("flags"))?.split(/\s+/) ?? []);
  const out = [{ force: "generic", name: "generic" }];
  if (flags.has("avx2") && flags.has("fma") && flags.has("f16c")) {
    out.push({ force: "avx2", name: "avx2" });
    if (flags.has("avx_vnni")) out.push({ force: "avxvnni", name: "avx-vnni" });
  }
  return out;
}

/**
 * Runs the tests of `file` whose names match `filter` in a child `deno test` with `env` added: the
 * CPU kernels are chosen once per process, so a forced path (KVRELAY_CPU_KERNEL) needs its own.
 * @param file the test file (import.meta.filename)
 * @param filter a --filter value (a name, or /regex/)
 * @param env variables for the child
 * @returns the child's exit code and its stdout + stderr
 */
export async function childTest(
  file: string,
  filter: string,
  env: Record<string, string>,
): Promise<{ code: number; text: string }> {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["test", "-A", "--no-check", "--config", "deno.dev.json", "--filter", filter, file],
    cwd: new URL("../../", import.meta.url).pathname,
    env: { ...env, NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  return { code, text: new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr) };
}
