// The AVX-512 GEMM kernels (native/src/host/gemm_avx512.cpp) keep every output's summation order,
// so the engine's logits must be bit-identical to the AVX2 kernels': the test library's selection
// "avx2" against "avx512" in one process (prefill tiles, few-row and GEMV paths over bf16 model
// weights, and kvr_gemm_f32 over f32 panels). "avx512" keeps AMX off where the CPU has it (bf16
// GEMMs of 8+ rows on the tile unit, another summation order). Skipped where the CPU has no
// AVX-512 (the kernel is then not chosen).

import assert from "node:assert/strict";
import { NativeModel } from "./model.ts";
import { cpuKernelName, gemmF32 } from "./gemm.ts";
import { checkpoint, cpuKernels, DEMO_DIRS, tokens, withCpuKernel } from "./test_helpers.ts";
import { probeBackend } from "./backend.ts";
import { openTestLibrary } from "./test_library.ts";

/** FNV-1a over float arrays. */
function fnv(arrays: Float32Array[]): string {
  let h = 0x811c9dc5;
  for (const x of arrays) {
    for (const b of new Uint8Array(x.buffer, x.byteOffset, x.byteLength)) {
      h = Math.imul(h ^ b, 0x01000193) >>> 0;
    }
  }
  return h.toString(16);
}

/** Logits (bf16 weights) of a 64-token allPositions prefill, a 5-token one and 8 decode steps. */
async function logitsDigest(dir: string): Promise<string> {
  using model = NativeModel.load(await checkpoint(dir), { threads: 2, lib: openTestLibrary() });
  const V = model.config.vocabSize;
  using s = model.createSequence(96);
  const out = [await s.prefill(tokens(64, V, 21), { allPositions: true })];
  out.push(await s.prefill(tokens(5, V, 22), { allPositions: true }));
  for (const t of tokens(8, V, 23)) out.push(await s.decode(t));
  return fnv(out);
}

/** kvr_gemm_f32 (f32 panels) over GEMV, few-row, row-block and tail shapes, 1 and 2 threads. */
function gemmDigest(): string {
  const out: Float32Array[] = [];
  for (const [m, n, k] of [[1, 515, 300], [5, 77, 513], [64, 160, 256], [131, 45, 70]]) {
    const a = Float32Array.from({ length: m * k }, (_, i) => Math.sin(i * 0.37));
    const b = Float32Array.from({ length: n * k }, (_, i) => Math.cos(i * 0.11));
    for (const t of [1, 2]) out.push(gemmF32(m, n, k, a, b, t));
  }
  return fnv(out);
}

async function digests(): Promise<string[]> {
  const d = [gemmDigest()];
  for (const dir of DEMO_DIRS) d.push(await logitsDigest(dir));
  return d;
}

/** The GEMM table's name, whether AMX is on, and the digests, on the given kernel selection. */
function onKernel(kernel: "avx2" | "avx512") {
  return withCpuKernel(kernel, async () => ({
    kernel: cpuKernelName(),
    amx: probeBackend("cpu", 0, openTestLibrary()).info.includes(", few-row bf16 amx,"),
    digests: await digests(),
  }));
}

Deno.test({
  name: "the AVX-512 GEMM kernels give the AVX2 kernels' logits bit for bit",
  ignore: !cpuKernels().includes("avx512"),
  async fn() {
    const mine = await onKernel("avx512");
    assert.equal(mine.kernel, "avx512");
    assert.equal(mine.amx, false, "the avx512 selection keeps AMX off");
    const avx2 = await onKernel("avx2");
    assert.equal(avx2.kernel, "avx2-fma", "the avx2 selection did not run the AVX2 kernels");
    assert.deepEqual(avx2.digests, mine.digests);
  },
});
