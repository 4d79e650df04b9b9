// Tests for q4 weights (`weights: "q4"`, native/src/host/gemm_q4.cpp, gemm_int8.cpp): resident
// bytes; prefill and decode logits within measured bounds of a model built from the dequantized
// weights (a dequantize-then-f32 reference: the difference is the int8 activations) and of bf16;
// the same bits at 1 and 2 threads and on every q4 kernel this machine can run (models loaded with
// each kernel cap, in this process). The GEMV / int8 GEMM arithmetic itself is checked against float64 in
// quant_gemv_test.ts / quant_gemm_test.ts; quality on real text: docs/int8_gemm.md (score).

import assert from "node:assert/strict";
import { loadCheckpoint } from "../model/mod.ts";
import type { SafetensorsEntry } from "../model/safetensors.ts";
import { encodeSafetensors } from "../model/safetensors.ts";
import { readAllEntries } from "../model/test_helpers.ts";
import { gemvQuantized } from "./gemm.ts";
import { NativeModel } from "./model.ts";
import { checkpoint, DEMO_DIRS, relDiff, tokens } from "./test_helpers.ts";
import { assertQuantKernelsAgree, digest } from "./quant_test_helpers.ts";

/** Logits of a 40-token allPositions prefill (all rows) and 12 decode steps after it. */
async function run(m: NativeModel): Promise<{ prefill: Float32Array; decode: Float32Array[] }> {
  using s = m.createSequence(64);
  const prefill = await s.prefill(tokens(40, m.config.vocabSize, 9), { allPositions: true });
  const decode: Float32Array[] = [];
  for (const t of tokens(12, m.config.vocabSize, 10)) decode.push(await s.decode(t));
  return { prefill, decode };
}

/** A tensor's values as f32 (F32 / BF16 / F16 little-endian). */
function toF32(e: SafetensorsEntry): Float32Array {
  const n = e.shape.reduce((a, b) => a * b, 1);
  if (e.dtype === "F32") return new Float32Array(e.data.slice().buffer, 0, n);
  const u16 = new Uint16Array(e.data.slice().buffer, 0, n);
  const out = new Float32Array(n);
  if (e.dtype === "BF16") {
    const u32 = new Uint32Array(out.buffer);
    for (let i = 0; i < n; i++) u32[i] = u16[i] << 16;
  } else {
    const dv = new DataView(e.data.buffer, e.data.byteOffset, e.data.byteLength);
    for (let i = 0; i < n; i++) out[i] = dv.getFloat16(2 * i, true);
  }
  return out;
}

const LINEAR = /\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.weight$/;

/**
 * Writes a copy of a demo checkpoint whose linear weights and (tied) embedding are the
 * q4-dequantized values as F32 (from the library's own packing, gemvQuantized): a tied q4 model
 * looks tokens up in its quantized lm_head. Loaded with as-stored weights, it is the
 * dequantize-then-f32 reference of the q4 model.
 */
async function dequantizedCopy(dir: string): Promise<string> {
  const out = await Deno.makeTempDir({ prefix: "kvr-q4-ref-" });
  for (const f of Deno.readDirSync(dir)) {
    if (f.isFile && f.name.endsWith(".json")) {
      await Deno.copyFile(`${dir}/${f.name}`, `${out}/${f.name}`);
    }
  }
  const config = JSON.parse(await Deno.readTextFile(`${dir}/config.json`));
  const entries = await readAllEntries(`${dir}/model.safetensors`);
  const deq = (e: SafetensorsEntry, name: string): SafetensorsEntry => {
    const [n, k] = e.shape;
    const { weights } = gemvQuantized("q4", n, k, toF32(e));
    return { name, dtype: "F32", shape: [n, k], data: new Uint8Array(weights.buffer) };
  };
  assert.ok(config.tie_word_embeddings, "the demo models tie their embeddings");
  const quantized = (name: string) => LINEAR.test(name) || name === "model.embed_tokens.weight";
  const written = entries.map((e) => quantized(e.name) ? deq(e, e.name) : e);
  assert.ok(written.filter((e) => e.dtype === "F32").length >= 7 * config.num_hidden_layers + 1);
  await Deno.writeFile(`${out}/model.safetensors`, encodeSafetensors(written, { format: "pt" }));
  return out;
}

Deno.test("q4 weights hold 0.625 bytes per weight and give logits within int8-activation error of the dequantized f32 model", async () => {
  for (const dir of DEMO_DIRS) {
    const refDir = await dequantizedCopy(dir);
    try {
      using q4 = NativeModel.load(await checkpoint(dir), { threads: 2, weights: "q4" });
      using ref = NativeModel.load(await loadCheckpoint(refDir), { threads: 2 });
      // Linear weights and the tied lm_head: per 16-column panel and 32-block, 256 code bytes +
      // 16 f16 scales + 16 f16 offsets. The rest is norms (f32): no embedding table is left
      // beside the quantized lm_head (lookups read it).
      const c = q4.config;
      const q4Bytes = (n: number, k: number) => Math.ceil(n / 16) * Math.ceil(k / 32) * 320;
      const qkvRows = (c.numHeads + 2 * c.numKvHeads) * c.headDim;
      const linear = c.numLayers * (q4Bytes(qkvRows, c.hiddenSize) +
            q4Bytes(c.hiddenSize, c.numHeads * c.headDim) +
            q4Bytes(2 * c.intermediateSize, c.hiddenSize) +
            q4Bytes(c.hiddenSize, c.intermediateSize)) + q4Bytes(c.vocabSize, c.hiddenSize);
      const rest = 4 * ((2 * c.numLayers + 1) * c.hiddenSize + 2 * c.numLayers * c.headDim);
      assert.ok(
        q4.weightBytes >= linear && q4.weightBytes <= linear + rest,
        `${dir}: ${q4.weightBytes} bytes, expected ${linear} + at most ${rest}`,
      );
      const a = await run(q4), b = await run(ref);
      // Prefill and decode quantize each activation row per 32-block (int8 dots) where the
      // reference multiplies f32 activations: measured 0.3–0.9% relative per position.
      const V = c.vocabSize;
      for (let p = 0; p < 40; p++) {
        const d = relDiff(
          a.prefill.subarray(p * V, (p + 1) * V),
          b.prefill.subarray(p * V, (p + 1) * V),
        );
        assert.ok(d > 0 && d < 2e-2, `${dir} prefill position ${p}: relative difference ${d}`);
      }
      for (let s = 0; s < a.decode.length; s++) {
        const d = relDiff(a.decode[s], b.decode[s]);
        assert.ok(d > 0 && d < 2e-2, `${dir} decode step ${s}: relative difference ${d}`);
      }
    } finally {
      await Deno.remove(refDir, { recursive: true });
    }
  }
});

Deno.test("q4 logits stay within the measured quantization error of bf16", async () => {
  for (const dir of DEMO_DIRS) {
    using bf16 = NativeModel.load(await checkpoint(dir), { threads: 1 });
    using q4 = NativeModel.load(await checkpoint(dir), { threads: 1, weights: "q4" });
    const a = await run(q4), b = await run(bf16);
    const V = q4.config.vocabSize;
    const steps = [a.prefill.slice(39 * V), ...a.decode];
    const refs = [b.prefill.slice(39 * V), ...b.decode];
    for (let s = 0; s < steps.length; s++) {
      const d = relDiff(steps[s], refs[s]);
      // 4-bit weights move the logits by a few percent of their range (measured 3–11% on the demo models); a
      // broken kernel or layout moves them by O(1).
      assert.ok(d > 1e-3 && d < 0.2, `${dir} step ${s}: relative difference ${d}`);
    }
  }
});

Deno.test("q4 decode gives the same bits at 1 and 2 threads", async () => {
  for (const dir of DEMO_DIRS) {
    using one = NativeModel.load(await checkpoint(dir), { threads: 1, weights: "q4" });
    using two = NativeModel.load(await checkpoint(dir), { threads: 2, weights: "q4" });
    const a = await run(one), b = await run(two);
    assert.equal(digest([a.prefill, ...a.decode]), digest([b.prefill, ...b.decode]), dir);
  }
});

Deno.test("q4 logits are bit-identical on every kernel this CPU can run (generic, avx2, avx-vnni)", () =>
  assertQuantKernelsAgree("q4"));
