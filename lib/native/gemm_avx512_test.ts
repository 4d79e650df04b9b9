// The AVX-512 GEMM kernels (native/src/host/gemm_avx512.cpp) keep every output's summation order,
// so the engine's logits must be bit-identical to the AVX2 kernels': compared against a child
// process forced to AVX2 with KVRELAY_CPU_KERNEL=avx2 (prefill tiles, few-row and GEMV paths over
// bf16 model weights, and kvr_gemm_f32 over f32 panels). Where the CPU also has AMX (bf16 GEMMs of
// 8+ rows on the tile unit, another summation order), the AVX-512 side is a child forced to
// KVRELAY_CPU_KERNEL=avx512. Skipped where the CPU has no AVX-512 (the kernel is then not chosen).

import assert from "node:assert/strict";
import { NativeModel } from "./model.ts";
import { cpuKernelName, gemmF32 } from "./gemm.ts";
import { checkpoint, childTest, DEMO_DIRS, tokens } from "./test_helpers.ts";
import { probeBackend } from "./backend.ts";

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
  using model = NativeModel.load(await checkpoint(dir), { threads: 2 });
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

const DIGEST_TEST = "engine logits digest per GEMM kernel (child process helper)";
Deno.test(DIGEST_TEST, async () => {
  const d = await digests();
  const out = Deno.env.get("KVR_GEMM_DIGEST_OUT");
  if (out) await Deno.writeTextFile(out, JSON.stringify({ kernel: cpuKernelName(), digests: d }));
});

/** The digests of a child `deno test` of this file with KVRELAY_CPU_KERNEL = kernel. */
async function childDigests(kernel: string): Promise<{ kernel: string; digests: string[] }> {
  const file = await Deno.makeTempFile({ prefix: "kvr-avx512-" });
  try {
    const { code, text } = await childTest(import.meta.filename!, DIGEST_TEST, {
      KVRELAY_CPU_KERNEL: kernel,
      KVR_GEMM_DIGEST_OUT: file,
    });
    assert.equal(code, 0, `${kernel} child failed:\n${text}`);
    return JSON.parse(await Deno.readTextFile(file));
  } finally {
    await Deno.remove(file);
  }
}

Deno.test({
  name: "the AVX-512 GEMM kernels give the AVX2 kernels' logits bit for bit",
  ignore: cpuKernelName() !== "avx512",
  async fn() {
    const amx = probeBackend("cpu").info.includes(", few-row bf16 amx,");
    const mine = amx
      ? await childDigests("avx512")
      : { kernel: cpuKernelName(), digests: await digests() };
    assert.equal(mine.kernel, "avx512");
    const child = await childDigests("avx2");
    assert.equal(child.kernel, "avx2-fma", "the child did not run the AVX2 kernels");
    assert.deepEqual(child.digests, mine.digests);
  },
});
