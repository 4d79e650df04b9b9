// Tests for q8 weights (`weights: "q8"`, native/src/host/gemm_q8.cpp): resident bytes, logits close
// to the bf16 model's (quantization error only), the same bits at 1 and 2 threads, and the same
// bits, prefill (int8 GEMM) and decode (GEMV), on every q8 kernel this machine can run (AVX-512
// VNNI by default; the portable integer, AVX2 and AVX-VNNI kernels on models loaded with the
// narrower kernel caps, in this process). Quality on real text: docs/native.md (score).

import assert from "node:assert/strict";
import { NativeModel } from "./model.ts";
import { checkpoint, DEMO_DIRS, relDiff, tokens } from "./test_helpers.ts";
import { assertQuantKernelsAgree, digest } from "./quant_test_helpers.ts";

/** Logits of a 40-token allPositions prefill (last row) and 12 decode steps. */
async function run(m: NativeModel): Promise<Float32Array[]> {
  const V = m.config.vocabSize;
  using s = m.createSequence(64);
  const all = await s.prefill(tokens(40, V, 9), { allPositions: true });
  const out: Float32Array[] = [all.slice(39 * V)];
  for (const t of tokens(12, V, 10)) out.push(await s.decode(t));
  return out;
}

Deno.test("q8 weights hold fewer bytes and give logits within quantization error of bf16", async () => {
  for (const dir of DEMO_DIRS) {
    using bf16 = NativeModel.load(await checkpoint(dir), { threads: 1 });
    using q8 = NativeModel.load(await checkpoint(dir), { threads: 1, weights: "q8" });
    // Linear weights (and the tied lm_head) hold 1.0625 bytes per weight, as llama.cpp's Q8_0:
    // 16-column panels of 32-wide blocks, 512 code bytes + 16 bf16 scales each. The rest is norms
    // (f32): the demo models tie their embeddings, and no table is left beside the quantized
    // lm_head (lookups read it).
    const c = q8.config;
    const q8Bytes = (n: number, k: number) => Math.ceil(n / 16) * Math.ceil(k / 32) * 544;
    const qkvRows = (c.numHeads + 2 * c.numKvHeads) * c.headDim;
    const linear = c.numLayers * (q8Bytes(qkvRows, c.hiddenSize) +
          q8Bytes(c.hiddenSize, c.numHeads * c.headDim) +
          q8Bytes(2 * c.intermediateSize, c.hiddenSize) +
          q8Bytes(c.hiddenSize, c.intermediateSize)) + q8Bytes(c.vocabSize, c.hiddenSize);
    const rest = 4 * ((2 * c.numLayers + 1) * c.hiddenSize + 2 * c.numLayers * c.headDim);
    assert.ok(
      q8.weightBytes >= linear && q8.weightBytes <= linear + rest,
      `${dir}: ${q8.weightBytes} bytes, expected ${linear} + at most ${rest}`,
    );
    const a = await run(bf16), b = await run(q8);
    for (let s = 0; s < a.length; s++) {
      const d = relDiff(b[s], a[s]);
      assert.ok(d > 0 && d < 3e-2, `${dir} step ${s}: relative difference ${d}`);
    }
  }
});

Deno.test("q8 decode gives the same bits at 1 and 2 threads", async () => {
  for (const dir of DEMO_DIRS) {
    using one = NativeModel.load(await checkpoint(dir), { threads: 1, weights: "q8" });
    using two = NativeModel.load(await checkpoint(dir), { threads: 2, weights: "q8" });
    assert.equal(digest(await run(one)), digest(await run(two)), dir);
  }
});

Deno.test("q8 logits are bit-identical on every kernel this CPU can run (generic, avx2, avx-vnni)", () =>
  assertQuantKernelsAgree("q8"));

Deno.test("`NativeModel.load()` rejects an unknown weights format before FFI", async () => {
  const ck = await checkpoint(DEMO_DIRS[0]);
  assert.throws(
    () => NativeModel.load(ck, { weights: "q3" as "q8" }),
    (e: unknown) =>
      e instanceof TypeError && /weights must be one of bf16, q8, q4, f32/.test(e.message),
  );
});
