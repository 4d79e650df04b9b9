// Tests for HF tensor-name classification and mapWeights' checks (unknown, unexpected, missing,
// mis-shaped tensors; tied heads). Expected roles/shapes are written out from the HF modeling code.

import assert from "node:assert/strict";
import { parseModelConfig } from "./config.ts";
import { ModelFormatError } from "./errors.ts";
import type { TensorInfo } from "./safetensors.ts";
import { classifyTensorName, expectedShape, mapWeights, type WeightRole } from "./weights.ts";

Deno.test("`classifyTensorName()` maps HF names to roles and layers", () => {
  assert.deepEqual(classifyTensorName("model.embed_tokens.weight"), { role: "embed", layer: 0 });
  assert.deepEqual(classifyTensorName("lm_head.weight"), { role: "lm_head", layer: 0 });
  assert.deepEqual(classifyTensorName("model.norm.weight"), { role: "final_norm", layer: 0 });
  assert.deepEqual(classifyTensorName("model.layers.12.self_attn.k_proj.bias"), {
    role: "k_bias",
    layer: 12,
  });
  assert.deepEqual(classifyTensorName("model.layers.0.self_attn.q_norm.weight"), {
    role: "q_norm",
    layer: 0,
  });
  assert.deepEqual(classifyTensorName("model.layers.3.mlp.down_proj.weight"), {
    role: "down",
    layer: 3,
  });
  assert.deepEqual(classifyTensorName("model.layers.1.post_attention_layernorm.weight"), {
    role: "mlp_norm",
    layer: 1,
  });
  assert.equal(classifyTensorName("model.layers.0.self_attn.rotary_emb.inv_freq"), "skip");
  assert.equal(classifyTensorName("model.rotary_emb.inv_freq"), "skip");
  assert.equal(classifyTensorName("model.layers.01.mlp.up_proj.weight"), null);
  assert.equal(classifyTensorName("model.layers.0.mlp.experts.0.weight"), null);
  assert.equal(classifyTensorName("transformer.wte.weight"), null);
});

const cfg = parseModelConfig({
  architectures: ["Qwen2ForCausalLM"],
  vocab_size: 10,
  hidden_size: 8,
  intermediate_size: 12,
  num_hidden_layers: 1,
  num_attention_heads: 2,
  num_key_value_heads: 1,
});

function table(
  config = cfg,
  extra: Record<string, number[]> = {},
  drop: string[] = [],
): Map<string, TensorInfo> {
  const roles: [string, WeightRole][] = [
    ["model.embed_tokens.weight", "embed"],
    ["model.norm.weight", "final_norm"],
    ["lm_head.weight", "lm_head"],
    ["model.layers.0.input_layernorm.weight", "attn_norm"],
    ["model.layers.0.self_attn.q_proj.weight", "q"],
    ["model.layers.0.self_attn.k_proj.weight", "k"],
    ["model.layers.0.self_attn.v_proj.weight", "v"],
    ["model.layers.0.self_attn.o_proj.weight", "o"],
    ["model.layers.0.self_attn.q_proj.bias", "q_bias"],
    ["model.layers.0.self_attn.k_proj.bias", "k_bias"],
    ["model.layers.0.self_attn.v_proj.bias", "v_bias"],
    ["model.layers.0.post_attention_layernorm.weight", "mlp_norm"],
    ["model.layers.0.mlp.gate_proj.weight", "gate"],
    ["model.layers.0.mlp.up_proj.weight", "up"],
    ["model.layers.0.mlp.down_proj.weight", "down"],
  ];
  const m = new Map<string, TensorInfo>();
  const add = (name: string, shape: number[]) =>
    m.set(name, {
      name,
      dtype: "F32",
      shape,
      file: "/f",
      offset: 0,
      nbytes: shape.reduce((a, b) => a * b) * 4,
    });
  for (const [name, role] of roles) {
    if (!drop.includes(name)) add(name, expectedShape(config, role));
  }
  for (const [name, shape] of Object.entries(extra)) add(name, shape);
  return m;
}

Deno.test("`expectedShape()` gives HF Linear (out, in) shapes for a GQA config", () => {
  assert.deepEqual(expectedShape(cfg, "q"), [8, 8]);
  assert.deepEqual(expectedShape(cfg, "k"), [4, 8]);
  assert.deepEqual(expectedShape(cfg, "o"), [8, 8]);
  assert.deepEqual(expectedShape(cfg, "k_bias"), [4]);
  assert.deepEqual(expectedShape(cfg, "down"), [8, 12]);
  assert.deepEqual(expectedShape(cfg, "embed"), [10, 8]);
});

Deno.test("`mapWeights()` orders a complete Qwen2 table and skips inv_freq", () => {
  const entries = mapWeights(
    cfg,
    table(cfg, { "model.layers.0.self_attn.rotary_emb.inv_freq": [2] }),
  );
  assert.deepEqual(entries.map((e) => e.role), [
    "embed",
    "attn_norm",
    "q",
    "k",
    "v",
    "o",
    "mlp_norm",
    "gate",
    "up",
    "down",
    "q_bias",
    "k_bias",
    "v_bias",
    "final_norm",
    "lm_head",
  ]);
});

function mapFails(t: Map<string, TensorInfo>, pattern: RegExp, config = cfg): void {
  assert.throws(() => mapWeights(config, t, "/ckpt"), (e: unknown) => {
    assert.ok(e instanceof ModelFormatError);
    assert.match(e.message, pattern);
    return true;
  });
}

Deno.test("`mapWeights()` names a missing required tensor", () => {
  mapFails(
    table(cfg, {}, ["model.layers.0.self_attn.v_proj.bias"]),
    /missing tensor "model\.layers\.0\.self_attn\.v_proj\.bias"/,
  );
  mapFails(table(cfg, {}, ["lm_head.weight"]), /missing tensor "lm_head\.weight"/);
});

Deno.test("`mapWeights()` refuses unknown, unexpected and out-of-range tensors", () => {
  mapFails(
    table(cfg, { "model.layers.0.mlp.extra.weight": [1] }),
    /unknown tensor name "model\.layers\.0\.mlp\.extra\.weight"/,
  );
  mapFails(
    table(cfg, { "model.layers.0.self_attn.o_proj.bias": [8] }),
    /unexpected tensor "model\.layers\.0\.self_attn\.o_proj\.bias"/,
  );
  mapFails(
    table(cfg, { "model.layers.0.self_attn.q_norm.weight": [4] }),
    /unexpected tensor .*q_norm/,
  );
  mapFails(
    table(cfg, { "model.layers.1.input_layernorm.weight": [8] }),
    /layer 1 >= num_hidden_layers 1/,
  );
});

Deno.test("`mapWeights()` names a mis-shaped tensor and quotes both shapes", () => {
  const t = table(cfg);
  t.set("model.layers.0.self_attn.k_proj.weight", {
    ...t.get("model.layers.0.self_attn.k_proj.weight")!,
    shape: [8, 8],
  });
  mapFails(
    t,
    /tensor "model\.layers\.0\.self_attn\.k_proj\.weight" has shape \[8,8\], expected \[4,8\]/,
  );
});

Deno.test("`mapWeights()` ignores a stored lm_head when embeddings are tied", () => {
  const tied = { ...cfg, tieWordEmbeddings: true };
  const entries = mapWeights(tied, table(tied));
  assert.ok(!entries.some((e) => e.role === "lm_head"));
  assert.equal(mapWeights(tied, table(tied, {}, ["lm_head.weight"])).length, entries.length);
});
