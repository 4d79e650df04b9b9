// Known-answer tests of the float64 reference forward pass and its safetensors reader, on micro
// models whose outputs are computed by hand (values in comments). These make the oracle
// trustworthy on its own; they do not touch lib/ or the native library.

import assert from "node:assert/strict";
import {
  applyRope,
  expectedWeights,
  meanNll,
  refConfigFromJson,
  referenceForward,
  type RefModel,
  rmsNorm,
  ropeInvFreq,
} from "./forward.ts";
import {
  bf16BitsToNumber,
  f16BitsToNumber,
  readSafetensorsFile,
  type Tensor64,
} from "./safetensors.ts";

function close(actual: number, expected: number, tol: number, what: string): void {
  assert.ok(Math.abs(actual - expected) <= tol, `${what}: got ${actual}, expected ${expected}`);
}

function t(shape: number[], values: number[]): Tensor64 {
  assert.equal(values.length, shape.reduce((a, b) => a * b, 1));
  return { shape, data: Float64Array.from(values) };
}

const zeros = (n: number) => new Array(n).fill(0);
const ones = (n: number) => new Array(n).fill(1);
const identity = (n: number) => {
  const m = zeros(n * n);
  for (let i = 0; i < n; i++) m[i * n + i] = 1;
  return m;
};

/** A 1-layer Llama, hidden 4, vocab 3, eps 0, q = k = 0 (uniform attention), v = o = identity,
 * MLP all zeros, tied head. Embedding rows: e0 = [1,0,0,0], e1 = [0,2,0,0], e2 = [1,1,1,1]. */
function microLlama(overrides: Record<string, unknown> = {}): RefModel {
  const config = refConfigFromJson({
    architectures: ["LlamaForCausalLM"],
    vocab_size: 3,
    hidden_size: 4,
    intermediate_size: 1,
    num_hidden_layers: 1,
    num_attention_heads: 1,
    num_key_value_heads: 1,
    rms_norm_eps: 0,
    tie_word_embeddings: true,
    ...overrides,
  });
  const weights = new Map<string, Tensor64>([
    ["model.embed_tokens.weight", t([3, 4], [1, 0, 0, 0, 0, 2, 0, 0, 1, 1, 1, 1])],
    ["model.norm.weight", t([4], ones(4))],
    ["model.layers.0.input_layernorm.weight", t([4], ones(4))],
    ["model.layers.0.post_attention_layernorm.weight", t([4], ones(4))],
    ["model.layers.0.self_attn.q_proj.weight", t([4, 4], zeros(16))],
    ["model.layers.0.self_attn.k_proj.weight", t([4, 4], zeros(16))],
    ["model.layers.0.self_attn.v_proj.weight", t([4, 4], identity(4))],
    ["model.layers.0.self_attn.o_proj.weight", t([4, 4], identity(4))],
    ["model.layers.0.mlp.gate_proj.weight", t([1, 4], zeros(4))],
    ["model.layers.0.mlp.up_proj.weight", t([1, 4], zeros(4))],
    ["model.layers.0.mlp.down_proj.weight", t([4, 1], zeros(4))],
  ]);
  return { config, weights };
}

Deno.test("f16BitsToNumber() decodes known IEEE half bit patterns exactly", () => {
  assert.equal(f16BitsToNumber(0x3c00), 1);
  assert.equal(f16BitsToNumber(0xc000), -2);
  assert.equal(f16BitsToNumber(0x3555), 0.333251953125); // 1/3 rounded to half
  assert.equal(f16BitsToNumber(0x7bff), 65504); // max finite
  assert.equal(f16BitsToNumber(0x0001), 2 ** -24); // smallest subnormal
  assert.equal(f16BitsToNumber(0x0400), 2 ** -14); // smallest normal
  assert.equal(f16BitsToNumber(0x7c00), Infinity);
  assert.ok(Number.isNaN(f16BitsToNumber(0x7e00)));
  assert.ok(Object.is(f16BitsToNumber(0x8000), -0));
});

Deno.test("bf16BitsToNumber() decodes known bfloat16 bit patterns exactly", () => {
  assert.equal(bf16BitsToNumber(0x3f80), 1);
  assert.equal(bf16BitsToNumber(0xc040), -3);
  assert.equal(bf16BitsToNumber(0x3eab), 0.333984375); // 1/3 rounded to bf16
  assert.equal(bf16BitsToNumber(0x0080), 2 ** -126);
  assert.equal(bf16BitsToNumber(0x0001), 2 ** -133);
  assert.equal(bf16BitsToNumber(0xff80), -Infinity);
});

Deno.test("readSafetensorsFile() decodes a hand-assembled file with F32, F16 and BF16 tensors", async () => {
  // data: a = F32 [1.5, -0.25] (8 bytes), b = F16 [2] (2 bytes), c = BF16 [[1],[-3]] (4 bytes)
  const header = JSON.stringify({
    a: { dtype: "F32", shape: [2], data_offsets: [0, 8] },
    b: { dtype: "F16", shape: [1], data_offsets: [8, 10] },
    c: { dtype: "BF16", shape: [2, 1], data_offsets: [10, 14] },
  });
  const hb = new TextEncoder().encode(header);
  const bytes = new Uint8Array(8 + hb.length + 14);
  const view = new DataView(bytes.buffer);
  view.setUint32(0, hb.length, true);
  bytes.set(hb, 8);
  const d = 8 + hb.length;
  bytes.set([0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x80, 0xbe], d); // 1.5f, -0.25f little-endian
  bytes.set([0x00, 0x40], d + 8); // half 2.0
  bytes.set([0x80, 0x3f, 0x40, 0xc0], d + 10); // bf16 1.0, -3.0
  const path = await Deno.makeTempFile({ suffix: ".safetensors" });
  try {
    await Deno.writeFile(path, bytes);
    const tensors = await readSafetensorsFile(path);
    assert.deepEqual([...tensors.get("a")!.data], [1.5, -0.25]);
    assert.deepEqual([...tensors.get("b")!.data], [2]);
    assert.deepEqual(tensors.get("c")!.shape, [2, 1]);
    assert.deepEqual([...tensors.get("c")!.data], [1, -3]);
  } finally {
    await Deno.remove(path);
  }
});

Deno.test("readSafetensorsFile() rejects offsets outside the file", async () => {
  const hb = new TextEncoder().encode(
    JSON.stringify({ a: { dtype: "F32", shape: [4], data_offsets: [0, 16] } }),
  );
  const bytes = new Uint8Array(8 + hb.length + 8); // only 8 data bytes of 16
  new DataView(bytes.buffer).setUint32(0, hb.length, true);
  bytes.set(hb, 8);
  const path = await Deno.makeTempFile({ suffix: ".safetensors" });
  try {
    await Deno.writeFile(path, bytes);
    await assert.rejects(readSafetensorsFile(path), /offsets/);
  } finally {
    await Deno.remove(path);
  }
});

Deno.test("rmsNorm() of [3, 4] with weight [1, 2] is [3, 8] / sqrt(12.5)", () => {
  // mean(x²) = (9 + 16) / 2 = 12.5; sqrt = 3.5355339; x / rms = [0.8485281, 1.1313708]
  const y = rmsNorm(Float64Array.from([3, 4]), Float64Array.from([1, 2]), 0);
  close(y[0], 0.848528137423857, 1e-12, "y0");
  close(y[1], 2.262741699796952, 1e-12, "y1");
  // eps enters under the root: x = [1], eps = 3 → 1 / sqrt(1 + 3) = 0.5
  close(rmsNorm(Float64Array.from([1]), Float64Array.from([1]), 3)[0], 0.5, 1e-15, "eps");
});

Deno.test("applyRope() is the identity at position 0 and rotates pairs (i, i + d/2) by pos·freq", () => {
  const inv = ropeInvFreq(4, 10000, null); // [1, 0.01]
  close(inv[0], 1, 0, "inv0");
  close(inv[1], 0.01, 1e-18, "inv1");
  const x = Float64Array.from([0.3, -1.2, 2.5, 0.7]);
  const at0 = x.slice();
  applyRope(at0, 0, inv);
  assert.deepEqual([...at0], [...x]);
  // Position 2: pair (x0, x2) rotated by 2 rad, pair (x1, x3) by 0.02 rad.
  const at2 = x.slice();
  applyRope(at2, 2, inv);
  close(at2[0], 0.3 * Math.cos(2) - 2.5 * Math.sin(2), 1e-15, "x0");
  close(at2[2], 2.5 * Math.cos(2) + 0.3 * Math.sin(2), 1e-15, "x2");
  close(at2[1], -1.2 * Math.cos(0.02) - 0.7 * Math.sin(0.02), 1e-15, "x1");
  close(at2[3], 0.7 * Math.cos(0.02) + -1.2 * Math.sin(0.02), 1e-15, "x3");
  // Literal check of pair (x0, x2) at pos 2: cos 2 = -0.4161468, sin 2 = 0.9092974.
  close(at2[0], 0.3 * -0.4161468365 - 2.5 * 0.9092974268, 1e-9, "x0 literal");
});

Deno.test("ropeInvFreq() applies llama3 scaling band by band (hand-computed, d = 8)", () => {
  // theta 10000, d 8: inv_freq = [1, 0.1, 0.01, 0.001]; wavelengths 2π/f = [6.28, 62.8, 628, 6283].
  // factor 8, low 1, high 4, orig 64: low_freq_wavelen 64, high_freq_wavelen 16.
  // i=0: 6.28 < 16 → 1 unchanged. i=2, 3: > 64 → f / 8 = 0.00125, 0.000125.
  // i=1: medium, smooth = (64 / 62.83 − 1) / (4 − 1) = 0.0061973; (1 − s)·0.1/8 + s·0.1 = 0.0130423
  const inv = ropeInvFreq(8, 10000, {
    type: "llama3",
    factor: 8,
    lowFreqFactor: 1,
    highFreqFactor: 4,
    originalMaxPosition: 64,
  });
  close(inv[0], 1, 1e-15, "inv0");
  close(inv[1], 0.013042256043820465, 1e-12, "inv1");
  close(inv[2], 0.00125, 1e-15, "inv2");
  close(inv[3], 0.000125, 1e-16, "inv3");
});

Deno.test("ropeInvFreq() divides every frequency by the factor for linear scaling", () => {
  const inv = ropeInvFreq(4, 100, { type: "linear", factor: 4 }); // [1, 0.1] / 4
  close(inv[0], 0.25, 1e-15, "inv0");
  close(inv[1], 0.025, 1e-15, "inv1");
});

Deno.test("referenceForward() returns v when attention sees one token (hand-computed logits)", () => {
  // Token 0: x = e0 = [1,0,0,0]; rmsnorm → [2,0,0,0] (rms = 0.5); attention over one token = v =
  // [2,0,0,0]; h = [3,0,0,0]; final norm → [2,0,0,0]; logits = E·[2,0,0,0] = [2, 0, 2].
  const logits = referenceForward(microLlama(), [0]);
  assert.deepEqual([...logits], [2, 0, 2]);
});

Deno.test("referenceForward() averages v under uniform attention and is causal", () => {
  // Tokens [0, 1]. Position 1: x1 = [0,2,0,0] → v1 = [0,2,0,0]; v0 = [2,0,0,0];
  // q = k = 0 → equal weights → attn = [1,1,0,0]; h1 = [1,3,0,0]; rms = sqrt(10/4) = 1.5811388;
  // normed = [0.6324555, 1.8973666, 0, 0]; logits = [0.6324555, 3.7947332, 2.5298221].
  const logits = referenceForward(microLlama(), [0, 1]);
  assert.deepEqual([...logits.subarray(0, 3)], [2, 0, 2]); // position 0 unchanged by token 1
  close(logits[3], 0.6324555320336759, 1e-12, "l0");
  close(logits[4], 3.7947331922020555, 1e-12, "l1");
  close(logits[5], 2.5298221281347035, 1e-12, "l2");
});

Deno.test("referenceForward() shares one kv head across query heads under GQA", () => {
  // heads 2, kv heads 1, head_dim 2: v_proj (2, 4) takes x[0], x[1]; o_proj = identity (4, 4),
  // so both query heads output the same v: h = x + [v0, v1, v0, v1].
  const m = microLlama({ num_attention_heads: 2, num_key_value_heads: 1 });
  m.weights.set("model.layers.0.self_attn.q_proj.weight", t([4, 4], zeros(16)));
  m.weights.set("model.layers.0.self_attn.k_proj.weight", t([2, 4], zeros(8)));
  m.weights.set("model.layers.0.self_attn.v_proj.weight", t([2, 4], [1, 0, 0, 0, 0, 1, 0, 0]));
  // Token 2: x = [1,1,1,1] → normed [1,1,1,1] → v = [1,1] → h = [2,2,2,2] → normed [1,1,1,1];
  // logits = [1, 2, 4].
  assert.deepEqual([...referenceForward(m, [2])], [1, 2, 4]);
  // Token 0: normed [2,0,0,0], v = [2,0], h = [1,0,0,0] + [2,0,2,0] = [3,0,2,0];
  // rms = sqrt(13/4); normed = [3,0,2,0]/1.8027756; logits = [1.6641006, 0, 2.7735010].
  const l = referenceForward(m, [0]);
  close(l[0], 3 / Math.sqrt(13 / 4), 1e-12, "l0");
  close(l[0], 1.6641005886756874, 1e-12, "l0 literal");
  close(l[2], 2.773500981126146, 1e-12, "l2 literal");
});

Deno.test("referenceForward() computes the SwiGLU MLP as down(silu(gate)·up)", () => {
  // Attention off (v = 0). gate and up read normed x[0], down writes to h[0].
  // Token 0: normed [2,0,0,0]; silu(2)·2 = 2/(1+e^-2)·2 = 3.5231883; h = [4.5231883, 0, 0, 0];
  // final norm → [2,0,0,0]; logits [2, 0, 2]. Token 2 instead: normed [1,1,1,1],
  // silu(1)·1 = 0.7310586; h = [1.7310586, 1, 1, 1].
  const m = microLlama();
  m.weights.set("model.layers.0.self_attn.v_proj.weight", t([4, 4], zeros(16)));
  m.weights.set("model.layers.0.mlp.gate_proj.weight", t([1, 4], [1, 0, 0, 0]));
  m.weights.set("model.layers.0.mlp.up_proj.weight", t([1, 4], [1, 0, 0, 0]));
  m.weights.set("model.layers.0.mlp.down_proj.weight", t([4, 1], [1, 0, 0, 0]));
  assert.deepEqual([...referenceForward(m, [0])], [2, 0, 2]);
  const h = [1.7310585786300049, 1, 1, 1];
  const rms = Math.sqrt(h.reduce((a, b) => a + b * b, 0) / 4);
  const l = referenceForward(m, [2]);
  close(l[0], h[0] / rms, 1e-12, "l0");
  close(l[2], h.reduce((a, b) => a + b, 0) / rms, 1e-12, "l2");
  close(l[0], 1.4138083, 1e-6, "l0 literal"); // 1.7310586 / 1.2243941
});

Deno.test("referenceForward() with Qwen3 q/k norm is invariant to scaling q_proj", () => {
  // Per-head RMSNorm of q removes any scale of q_proj; without it, scores change.
  const base = (arch: string) => {
    const m = microLlama({ architectures: [arch] }); // eps 0: exact invariance
    const qk = [0.5, -0.2, 0.1, 0.3, 0.1, 0.4, -0.3, 0.2, -0.1, 0.2, 0.6, 0.1, 0.3, 0.1, -0.2, 0.5];
    m.weights.set("model.layers.0.self_attn.q_proj.weight", t([4, 4], qk));
    m.weights.set("model.layers.0.self_attn.k_proj.weight", t([4, 4], qk.slice().reverse()));
    if (arch === "Qwen3ForCausalLM") {
      m.weights.set("model.layers.0.self_attn.q_norm.weight", t([4], ones(4)));
      m.weights.set("model.layers.0.self_attn.k_norm.weight", t([4], ones(4)));
    }
    return m;
  };
  const scaled = (m: RefModel) => {
    const w = m.weights.get("model.layers.0.self_attn.q_proj.weight")!;
    m.weights.set(
      "model.layers.0.self_attn.q_proj.weight",
      t(w.shape, [...w.data].map((x) => 7 * x)),
    );
    return m;
  };
  const tokens = [0, 2, 1, 2];
  const q3 = referenceForward(base("Qwen3ForCausalLM"), tokens);
  const q3s = referenceForward(scaled(base("Qwen3ForCausalLM")), tokens);
  for (let i = 0; i < q3.length; i++) close(q3s[i], q3[i], 1e-9, `qwen3 logit ${i}`);
  const ll = referenceForward(base("LlamaForCausalLM"), tokens);
  const lls = referenceForward(scaled(base("LlamaForCausalLM")), tokens);
  assert.ok(Math.max(...ll.map((x, i) => Math.abs(x - lls[i]))) > 1e-3, "llama should change");
});

Deno.test("expectedWeights() follows transformers' bias rules per architecture", () => {
  const base = {
    vocab_size: 8,
    hidden_size: 4,
    intermediate_size: 2,
    num_hidden_layers: 1,
    num_attention_heads: 1,
  };
  const names = (cfg: Record<string, unknown>) =>
    [...expectedWeights(refConfigFromJson({ ...base, ...cfg })).keys()].filter((n) =>
      n.endsWith(".bias")
    ).map((n) => n.replace("model.layers.0.", ""));
  assert.deepEqual(names({ architectures: ["Qwen2ForCausalLM"] }), [
    "self_attn.q_proj.bias",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",
  ]);
  assert.deepEqual(names({ architectures: ["MistralForCausalLM"], attention_bias: true }), []);
  assert.equal(names({ architectures: ["LlamaForCausalLM"], attention_bias: true }).length, 4);
  assert.equal(names({ architectures: ["LlamaForCausalLM"], mlp_bias: true }).length, 3);
  assert.equal(names({ architectures: ["Qwen3ForCausalLM"], attention_bias: true }).length, 4);
});

Deno.test("meanNll() of uniform logits is log(vocab)", () => {
  const vocab = 5;
  const logits = new Float64Array(3 * vocab).fill(0.7);
  close(meanNll(logits, [1, 2, 3], vocab), Math.log(5), 1e-12, "nll");
});
