// Test-only helpers for lib/native tests: deterministic token streams, logits comparison, a cached
// demo-model loader, and the kernel caps this CPU can run with the kernels each must select. Not
// imported by production code.

import { type Checkpoint, loadCheckpoint, mapWeights } from "../model/mod.ts";
import { type CpuKernel, encodePaths, encodeTensorTable } from "./layout.ts";
import type { NativeLibrary } from "./library.ts";
import { NativeModel } from "./model.ts";

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

/** The CPU's feature flags as /proc/cpuinfo lists them (empty where it does not exist): the
 *  independent oracle of which kernel paths this CPU has. */
export function cpuFlags(): Set<string> {
  try {
    const text = Deno.readTextFileSync("/proc/cpuinfo");
    return new Set((text.match(/^flags\s*:(.*)$/m)?.[1] ?? "").split(/\s+/));
  } catch {
    return new Set();
  }
}

/** The q8/q4 kernel each narrower kernel cap must select on this CPU (/proc/cpuinfo flags), for
 *  the caps that select a path this CPU has: each is compared with the default (auto) in-process. */
export function quantKernelCaps(): { cap: CpuKernel; name: string }[] {
  const flags = cpuFlags();
  const out: { cap: CpuKernel; name: string }[] = [{ cap: "generic", name: "generic" }];
  if (flags.has("avx2") && flags.has("fma") && flags.has("f16c")) {
    out.push({ cap: "avx2", name: "avx2" });
    if (flags.has("avx_vnni")) out.push({ cap: "avxvnni", name: "avx-vnni" });
  }
  return out;
}

/**
 * The kernels a CPU model's description names, by kind (NativeModel.deviceInfo "… kernels (gemm
 * avx512, int8 avx512-vnni, q8 avx512-vnni, q4 avx512-vnni), 2 threads").
 * @param deviceInfo the description
 * @returns the kernel name of each kind present (gemm, int8, q8, q4)
 */
export function namedKernels(deviceInfo: string): Record<string, string> {
  return Object.fromEntries(
    [...deviceInfo.matchAll(/\b(gemm|int8|q8|q4) ([\w-]+)/g)].map((m) => [m[1], m[2]]),
  );
}

/**
 * The kernels a model loaded with kernel cap `cap` runs (a demo model's description): what the
 * test library's entry points run under the same cap.
 * @param cap the kernel cap
 * @returns the kernel name of each kind (gemm, int8, q8, q4)
 */
export async function capKernels(cap: CpuKernel): Promise<Record<string, string>> {
  using m = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1, cpuKernel: cap });
  return namedKernels(m.deviceInfo);
}

/**
 * Calls kvr_model_load with `params` as they are (no NativeModel checks before it), so the
 * library's own checks answer.
 * @param lib the library
 * @param ckpt the checkpoint whose files and tensor table are passed
 * @param params kvr_model_params bytes (encodeModelParams, patched by the test)
 * @returns the status, and the model (null unless the status is 0; the caller frees it)
 */
export function rawModelLoad(
  lib: NativeLibrary,
  ckpt: Checkpoint,
  params: Uint8Array,
): { status: number; model: Deno.PointerObject | null } {
  const paths = encodePaths(ckpt.files);
  const table = encodeTensorTable(mapWeights(ckpt.config, ckpt.tensors), ckpt.files);
  const out = new BigUint64Array(1);
  const status = lib.symbols.kvr_model_load(
    params,
    paths,
    BigInt(paths.length),
    ckpt.files.length,
    table,
    BigInt(table.length / 64),
    out,
  );
  return { status, model: status === 0 ? Deno.UnsafePointer.create(out[0]) : null };
}
