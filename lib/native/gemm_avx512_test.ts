// The AVX-512 GEMM kernels (native/src/host/gemm_avx512.cpp) keep every output's summation order,
// so the engine's logits must be bit-identical to the AVX2 kernels': the same prefill and decode
// steps (prefill tiles, few-row and GEMV paths over bf16 model weights) and kvr_gemm_f32 over f32
// panels, run under the "avx512" kernel cap (AMX off: bf16 GEMMs of 8+ rows on the tile unit sum
// in another order) and under "avx2", in this process. Skipped where the CPU has no AVX-512 (the
// kernel is then not chosen).

import assert from "node:assert/strict";
import { NativeModel } from "./model.ts";
import { cpuKernelName, gemmF32 } from "./gemm.ts";
import type { CpuKernel } from "./layout.ts";
import { checkpoint, DEMO_DIRS, tokens } from "./test_helpers.ts";

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

/** Logits (bf16 weights) of a 64-token allPositions prefill, a 5-token one and 8 decode steps,
 *  on a model loaded with `cap`, and the GEMM kernel its description names. */
async function logitsDigest(
  dir: string,
  cap: CpuKernel,
): Promise<{ gemm: string; digest: string }> {
  using model = NativeModel.load(await checkpoint(dir), { threads: 2, cpuKernel: cap });
  const V = model.config.vocabSize;
  using s = model.createSequence(96);
  const out = [await s.prefill(tokens(64, V, 21), { allPositions: true })];
  out.push(await s.prefill(tokens(5, V, 22), { allPositions: true }));
  for (const t of tokens(8, V, 23)) out.push(await s.decode(t));
  return {
    gemm: model.deviceInfo.match(/\(gemm ([\w-]+)/)?.[1] ?? model.deviceInfo,
    digest: fnv(out),
  };
}

/** kvr_gemm_f32 (f32 panels) over GEMV, few-row, row-block and tail shapes, 1 and 2 threads. */
function gemmDigest(cap: CpuKernel): string {
  const out: Float32Array[] = [];
  for (const [m, n, k] of [[1, 515, 300], [5, 77, 513], [64, 160, 256], [131, 45, 70]]) {
    const a = Float32Array.from({ length: m * k }, (_, i) => Math.sin(i * 0.37));
    const b = Float32Array.from({ length: n * k }, (_, i) => Math.cos(i * 0.11));
    for (const t of [1, 2]) out.push(gemmF32(m, n, k, a, b, t, cap));
  }
  return fnv(out);
}

/** The digests under `cap`, each model's named kernel checked against `kernel`. */
async function digests(cap: CpuKernel, kernel: string): Promise<string[]> {
  assert.equal(cpuKernelName(cap), kernel, `the ${cap} cap's GEMM kernel`);
  const d = [gemmDigest(cap)];
  for (const dir of DEMO_DIRS) {
    const { gemm, digest } = await logitsDigest(dir, cap);
    assert.equal(gemm, kernel, `${dir} loaded with ${cap}: the kernel its description names`);
    d.push(digest);
  }
  return d;
}

Deno.test({
  name: "the AVX-512 GEMM kernels give the AVX2 kernels' logits bit for bit",
  ignore: cpuKernelName("avx512") !== "avx512",
  async fn() {
    assert.deepEqual(await digests("avx2", "avx2-fma"), await digests("avx512", "avx512"));
  },
});
