// Oracle test for bf16-resident weights: a default load keeps BF16 checkpoint weights as bf16 and
// widens them exactly in the kernels, so its logits must be bit-identical to a load with weights
// "f32" (KVR_WEIGHTS_F32: widened at load, the previous engine). Where the CPU has AMX, bf16 GEMMs
// of 8+ rows run on the tile unit (same products, another summation order: docs/gemm.md "AMX"): there
// the identity is checked on models loaded with the "avx512" kernel cap (AMX off), and the AMX
// logits within 1e-5 of f32's. The identity also holds on the portable kernels ("generic"). Not a
// numerical-accuracy test (that is tests/native_vs_reference_test.ts). Needs the built library
// (`deno task build:native`, or KVRELAY_LIB).

import assert from "node:assert/strict";
import { NativeModel } from "./model.ts";
import { probeBackend } from "./backend.ts";
import type { CpuKernel } from "./layout.ts";
import { checkpoint, DEMO_DIRS, tokens } from "./test_helpers.ts";

const PREFILL = 64;
const SMALL_PREFILL = 5;
const DECODE_STEPS = 16;
/** Whether this process's bf16 GEMMs of 8+ rows run on AMX tiles. */
const AMX = probeBackend("cpu").info.includes(", few-row bf16 amx,");

/** Largest |a[i] - b[i]| (NaN-aware: a NaN on either side counts as Infinity unless both are). */
function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  assert.equal(a.length, b.length, "logit lengths differ");
  let d = 0;
  for (let i = 0; i < a.length; i++) {
    const x = a[i], y = b[i];
    if (Number.isNaN(x) || Number.isNaN(y)) {
      if (!(Number.isNaN(x) && Number.isNaN(y))) return Infinity;
      continue;
    }
    d = Math.max(d, Math.abs(x - y));
  }
  return d;
}

/** Loads dir with bf16-resident weights, or widened to f32 at load (weights "f32"), under kernel
 *  cap `cap`. */
async function load(
  dir: string,
  f32: boolean,
  threads: number,
  cap: CpuKernel = "auto",
): Promise<NativeModel> {
  return await NativeModel.load(await checkpoint(dir), {
    threads,
    weights: f32 ? "f32" : "bf16",
    cpuKernel: cap,
  });
}

/**
 * Logits of a 64-token allPositions prefill, of a 5-token allPositions prefill after it (the
 * few-rows GEMM path), then of 16 decode steps (one array each).
 */
async function run(model: NativeModel, seed: number): Promise<Float32Array[]> {
  const vocab = model.config.vocabSize;
  using seq = model.createSequence(PREFILL + SMALL_PREFILL + DECODE_STEPS);
  const out = [await seq.prefill(tokens(PREFILL, vocab, seed), { allPositions: true })];
  out.push(await seq.prefill(tokens(SMALL_PREFILL, vocab, seed + 2), { allPositions: true }));
  const next = tokens(DECODE_STEPS, vocab, seed + 1);
  for (let i = 0; i < DECODE_STEPS; i++) out.push(await seq.decode(next[i]));
  return out;
}

/** Name of step s of run(). */
function stepName(s: number): string {
  if (s === 0) return `prefill(${PREFILL}, allPositions)`;
  if (s === 1) return `prefill(${SMALL_PREFILL}, allPositions)`;
  return `decode step ${s - 1}`;
}

const IDENTITY_TEST = "`NativeModel.load()` gives bit-identical logits with bf16 and f32 weights";

// auto where AMX is off anyway; avx512 (AMX off) where the CPU has AMX; generic everywhere.
for (const cap of ["auto", "avx512", "generic"] as const) {
  for (const threads of [1, 2]) {
    Deno.test({
      name: `${IDENTITY_TEST} (${threads} thread${threads > 1 ? "s" : ""}, ${cap}${
        cap === "avx512" ? ": AMX off" : ""
      })`,
      ignore: cap === "auto" ? AMX : cap === "avx512" ? !AMX : false,
      fn: () => identity(threads, cap),
    });
  }
}

async function identity(threads: number, cap: CpuKernel): Promise<void> {
  {
    for (const [i, dir] of DEMO_DIRS.entries()) {
      using bf16 = await load(dir, false, threads, cap);
      using f32 = await load(dir, true, threads, cap);
      // The demo checkpoints are BF16: only norms (and biases) stay f32, so the default load must
      // hold about half the bytes — otherwise both loads took the f32 path and this test proves
      // nothing.
      const ratio = bf16.weightBytes / f32.weightBytes;
      assert.ok(ratio > 0.49 && ratio < 0.52, `${dir}: bf16/f32 weight bytes = ${ratio}`);
      const a = await run(bf16, 1000 + i);
      const b = await run(f32, 1000 + i);
      for (let s = 0; s < a.length; s++) {
        const what = stepName(s);
        assert.ok(a[s].every(Number.isFinite), `${dir}: ${what} has non-finite logits`);
        const d = maxAbsDiff(a[s], b[s]);
        assert.equal(d, 0, `${dir} (${threads} threads): ${what}: max |bf16 - f32| = ${d}`);
      }
    }
  }
}

Deno.test({
  name: "`NativeModel.load()` bf16 logits on AMX tiles are within 1e-5 of the f32 weights' logits",
  ignore: !AMX,
  async fn() {
    for (const [i, dir] of DEMO_DIRS.entries()) {
      using bf16 = await load(dir, false, 2);
      using f32 = await load(dir, true, 2);
      const a = await run(bf16, 1000 + i);
      const b = await run(f32, 1000 + i);
      let prefillDiffers = false;
      for (let s = 0; s < a.length; s++) {
        let num = 0, den = 0;
        for (let j = 0; j < a[s].length; j++) {
          num += (a[s][j] - b[s][j]) ** 2;
          den += b[s][j] ** 2;
        }
        const rel = Math.sqrt(num / den);
        assert.ok(rel <= 1e-5, `${dir}: ${stepName(s)}: relative L2 difference ${rel}`);
        if (s === 0 && num > 0) prefillDiffers = true;
      }
      // Otherwise the AMX tiles did not run for the 64-row prefill and this test proves nothing.
      assert.ok(prefillDiffers, `${dir}: the bf16 prefill gave the f32 bits: AMX not used?`);
    }
  },
});

Deno.test("`NativeModel.load()` holds a tied embedding once (the lm_head panels), bf16 or f32", async () => {
  for (const dir of DEMO_DIRS) {
    const ckpt = await checkpoint(dir);
    const { vocabSize, hiddenSize, tieWordEmbeddings } = ckpt.config;
    assert.ok(tieWordEmbeddings, `${dir}: the demo models are tied; this test needs one`);
    // Oracle: the file's tensors, each held once. bf16 matrices stay 2 bytes per weight (panel
    // padding adds < 16 rows per matrix); 1-D norms are widened to f32 (2 extra bytes each).
    let fileBytes = 0, normBytes = 0;
    for (const t of ckpt.tensors.values()) {
      fileBytes += t.nbytes;
      if (t.shape.length === 1) normBytes += t.nbytes;
    }
    const embedBytes = vocabSize * hiddenSize * 2;
    for (const f32 of [false, true]) {
      using m = await load(dir, f32, 1);
      const held = f32 ? 2 * fileBytes : fileBytes + normBytes;
      // A second copy of the embedding would add embedBytes (x2 in f32) on top.
      const slack = (f32 ? 2 : 1) * embedBytes / 4;
      assert.ok(
        m.weightBytes >= held && m.weightBytes < held + slack,
        `${dir} (${f32 ? "f32" : "bf16"}): ${m.weightBytes} weight bytes, expected ${held} ` +
          `(+ padding < ${slack}); one embedding is ${(f32 ? 2 : 1) * embedBytes}`,
      );
    }
  }
});
