// Tests for parseModelConfig/readGenerationSampling: each family, HF defaults, RoPE variants and
// refused/invalid values. Expected values are written out by hand from the HF config classes.

import assert from "node:assert/strict";
import { parseModelConfig, readGenerationSampling } from "./config.ts";
import { ModelFormatError } from "./errors.ts";

const base = {
  architectures: ["LlamaForCausalLM"],
  model_type: "llama",
  vocab_size: 1000,
  hidden_size: 256,
  intermediate_size: 512,
  num_hidden_layers: 2,
  num_attention_heads: 8,
  rms_norm_eps: 1e-5,
};

function fails(json: unknown, pattern: RegExp): void {
  assert.throws(() => parseModelConfig(json, "/x/config.json"), (e: unknown) => {
    assert.ok(e instanceof ModelFormatError, `expected ModelFormatError, got ${e}`);
    assert.match(e.message, pattern);
    assert.equal(e.path, "/x/config.json");
    assert.ok(e.message.startsWith("/x/config.json: "));
    return true;
  });
}

Deno.test("`parseModelConfig()` applies Llama defaults when optional fields are absent", () => {
  const c = parseModelConfig(base);
  assert.deepEqual(c, {
    architecture: "LlamaForCausalLM",
    family: "llama",
    vocabSize: 1000,
    hiddenSize: 256,
    intermediateSize: 512,
    numLayers: 2,
    numHeads: 8,
    numKvHeads: 8,
    headDim: 32,
    rmsNormEps: 1e-5,
    ropeTheta: 10000,
    ropeScaling: null,
    tieWordEmbeddings: false,
    attentionBias: false,
    mlpBias: false,
    maxPositionEmbeddings: 2048,
    bosTokenId: null,
    eosTokenIds: [],
  });
});

Deno.test("`parseModelConfig()` reads the demo tiny-balanced config (Llama, GQA 3/1, tied)", async () => {
  const json = JSON.parse(
    await Deno.readTextFile(new URL("../../models/tiny-balanced/config.json", import.meta.url)),
  );
  const c = parseModelConfig(json);
  assert.equal(c.family, "llama");
  assert.deepEqual(
    [
      c.vocabSize,
      c.hiddenSize,
      c.intermediateSize,
      c.numLayers,
      c.numHeads,
      c.numKvHeads,
      c.headDim,
    ],
    [4096, 192, 512, 6, 3, 1, 64],
  );
  assert.equal(c.tieWordEmbeddings, true);
  assert.equal(c.maxPositionEmbeddings, 256);
  assert.deepEqual(c.eosTokenIds, [4093]);
  assert.equal(c.bosTokenId, 4093);
});

Deno.test("`parseModelConfig()` reads Qwen3 with HF head_dim default 128 when head_dim is absent", () => {
  const c = parseModelConfig({
    ...base,
    architectures: ["Qwen3ForCausalLM"],
    model_type: "qwen3",
    num_key_value_heads: 2,
  });
  assert.equal(c.family, "qwen3");
  assert.equal(c.headDim, 128);
  assert.equal(c.numKvHeads, 2);
  assert.equal(c.maxPositionEmbeddings, 32768);
  const explicit = parseModelConfig({
    ...base,
    architectures: ["Qwen3ForCausalLM"],
    model_type: "qwen3",
    head_dim: 64,
    attention_bias: true,
  });
  assert.equal(explicit.headDim, 64);
  assert.equal(explicit.attentionBias, true);
});

Deno.test("`parseModelConfig()` marks Qwen2 as having q/k/v bias even without attention_bias", () => {
  const c = parseModelConfig({ ...base, architectures: ["Qwen2ForCausalLM"], model_type: "qwen2" });
  assert.equal(c.family, "qwen2");
  assert.equal(c.attentionBias, true);
  assert.equal(c.mlpBias, false);
});

Deno.test("`parseModelConfig()` maps Mistral to the llama family without biases", () => {
  const c = parseModelConfig({
    ...base,
    architectures: ["MistralForCausalLM"],
    model_type: "mistral",
    sliding_window: null,
    attention_bias: true,
    mlp_bias: true,
  });
  assert.equal(c.architecture, "MistralForCausalLM");
  assert.equal(c.family, "llama");
  assert.equal(c.attentionBias, false);
  assert.equal(c.mlpBias, false);
  assert.equal(c.maxPositionEmbeddings, 32768);
});

Deno.test("`parseModelConfig()` keeps Llama attention_bias and mlp_bias when set", () => {
  const c = parseModelConfig({ ...base, attention_bias: true, mlp_bias: true });
  assert.equal(c.attentionBias, true);
  assert.equal(c.mlpBias, true);
});

Deno.test("`parseModelConfig()` reads linear rope scaling under both `type` and `rope_type`", () => {
  for (const key of ["type", "rope_type"]) {
    const c = parseModelConfig({ ...base, rope_scaling: { [key]: "linear", factor: 4 } });
    assert.deepEqual(c.ropeScaling, { type: "linear", factor: 4 });
  }
});

Deno.test("`parseModelConfig()` reads llama3 rope scaling", () => {
  const c = parseModelConfig({
    ...base,
    rope_theta: 500000,
    rope_scaling: {
      rope_type: "llama3",
      factor: 8,
      low_freq_factor: 1,
      high_freq_factor: 4,
      original_max_position_embeddings: 8192,
    },
  });
  assert.equal(c.ropeTheta, 500000);
  assert.deepEqual(c.ropeScaling, {
    type: "llama3",
    factor: 8,
    lowFreqFactor: 1,
    highFreqFactor: 4,
    originalMaxPosition: 8192,
  });
});

Deno.test("`parseModelConfig()` treats rope_type default as no scaling and reads rope_parameters", () => {
  assert.equal(
    parseModelConfig({ ...base, rope_scaling: { rope_type: "default" } }).ropeScaling,
    null,
  );
  const c = parseModelConfig({
    ...base,
    rope_parameters: { rope_type: "linear", factor: 2, rope_theta: 1e6 },
  });
  assert.equal(c.ropeTheta, 1e6);
  assert.deepEqual(c.ropeScaling, { type: "linear", factor: 2 });
});

Deno.test("`parseModelConfig()` refuses unsupported rope types, quoting them", () => {
  fails(
    { ...base, rope_scaling: { rope_type: "yarn", factor: 4 } },
    /unsupported rope type "yarn"/,
  );
  fails(
    { ...base, rope_scaling: { type: "dynamic", factor: 2 } },
    /unsupported rope type "dynamic"/,
  );
});

Deno.test("`parseModelConfig()` refuses llama3 scaling with a missing or inverted factor", () => {
  fails(
    {
      ...base,
      rope_scaling: { rope_type: "llama3", factor: 8, low_freq_factor: 1, high_freq_factor: 4 },
    },
    /rope_scaling\.original_max_position_embeddings" is required/,
  );
  fails(
    {
      ...base,
      rope_scaling: {
        rope_type: "llama3",
        factor: 8,
        low_freq_factor: 4,
        high_freq_factor: 4,
        original_max_position_embeddings: 8192,
      },
    },
    /high_freq_factor \(4\) must exceed low_freq_factor \(4\)/,
  );
  fails({ ...base, rope_scaling: { type: "linear" } }, /"rope_scaling\.factor" is required/);
  fails({ ...base, rope_scaling: { type: "linear", factor: -2 } }, /rope_scaling\.factor.*got -2/);
});

Deno.test("`parseModelConfig()` refuses unsupported architectures, quoting them", () => {
  fails(
    { ...base, architectures: ["GPT2LMHeadModel"] },
    /unsupported architecture "GPT2LMHeadModel"/,
  );
  fails({ ...base, architectures: [] }, /field "architectures"/);
  fails(
    { ...base, model_type: "qwen2" },
    /model_type "qwen2" does not match architecture "LlamaForCausalLM"/,
  );
});

Deno.test("`parseModelConfig()` refuses sliding-window attention and non-silu activations", () => {
  fails(
    { ...base, architectures: ["Qwen2ForCausalLM"], model_type: "qwen2", use_sliding_window: true },
    /use_sliding_window/,
  );
  fails(
    { ...base, architectures: ["MistralForCausalLM"], model_type: "mistral", sliding_window: 1024 },
    /sliding_window 1024 < max_position_embeddings 32768/,
  );
  fails(
    { ...base, architectures: ["MistralForCausalLM"], model_type: "mistral" },
    /sliding_window 4096 \(HF default\) < max_position_embeddings 32768/,
  );
  assert.equal(
    parseModelConfig({
      ...base,
      architectures: ["MistralForCausalLM"],
      model_type: "mistral",
      max_position_embeddings: 4096,
    }).maxPositionEmbeddings,
    4096,
  );
  fails({ ...base, layer_types: ["full_attention", "sliding_attention"] }, /"sliding_attention"/);
  fails({ ...base, hidden_act: "gelu" }, /unsupported hidden_act "gelu"/);
});

Deno.test("`parseModelConfig()` names the field and quotes the value for invalid numbers", () => {
  fails({ ...base, hidden_size: -3 }, /field "hidden_size".*got -3/);
  fails({ ...base, vocab_size: 10.5 }, /field "vocab_size".*got 10\.5/);
  fails({ ...base, num_hidden_layers: "2" }, /field "num_hidden_layers".*got "2"/);
  fails({ ...base, rms_norm_eps: 0 }, /field "rms_norm_eps".*got 0/);
  const { intermediate_size: _drop, ...missing } = base;
  fails(missing, /field "intermediate_size".*got nothing/);
  fails([1, 2], /config must be a JSON object/);
  fails(null, /config must be a JSON object/);
});

Deno.test("`parseModelConfig()` refuses inconsistent head geometry", () => {
  fails(
    { ...base, num_key_value_heads: 3 },
    /num_attention_heads \(8\) is not a multiple of num_key_value_heads \(3\)/,
  );
  fails(
    { ...base, num_attention_heads: 6 },
    /hidden_size \(256\) is not divisible by num_attention_heads \(6\)/,
  );
  fails({ ...base, head_dim: 33 }, /head_dim 33 must be even/);
});

Deno.test("`parseModelConfig()` accepts eos_token_id as number or array and checks it against vocab", () => {
  assert.deepEqual(parseModelConfig({ ...base, eos_token_id: 7 }).eosTokenIds, [7]);
  assert.deepEqual(parseModelConfig({ ...base, eos_token_id: [7, 9, 7] }).eosTokenIds, [7, 9]);
  assert.deepEqual(parseModelConfig({ ...base, eos_token_id: null }).eosTokenIds, []);
  fails({ ...base, eos_token_id: 1000 }, /special token id 1000 >= vocab_size 1000/);
  fails({ ...base, eos_token_id: [1, -1] }, /field "eos_token_id\.1".*got -1/);
});

Deno.test("`parseModelConfig()` reads tie_word_embeddings and max_position_embeddings", () => {
  const c = parseModelConfig({ ...base, tie_word_embeddings: true, max_position_embeddings: 4096 });
  assert.equal(c.tieWordEmbeddings, true);
  assert.equal(c.maxPositionEmbeddings, 4096);
});

Deno.test("`readGenerationSampling()` reads vLLM's fields, do_sample false as greedy, null as absent, and refuses bad values", async () => {
  const dir = await Deno.makeTempDir();
  const write = (g: unknown) =>
    Deno.writeTextFile(`${dir}/generation_config.json`, JSON.stringify(g));
  try {
    assert.deepEqual(await readGenerationSampling(dir), {}); // no file
    await write({
      eos_token_id: 2,
      do_sample: true,
      temperature: 0.7,
      top_p: 0.9,
      top_k: 40,
      min_p: 0.05,
      repetition_penalty: 1.15,
    });
    assert.deepEqual(await readGenerationSampling(dir), {
      temperature: 0.7,
      top_p: 0.9,
      top_k: 40,
      min_p: 0.05,
      repetition_penalty: 1.15,
    });
    await write({ do_sample: false, temperature: 0.7, top_p: null, top_k: -1 });
    assert.deepEqual(await readGenerationSampling(dir), { temperature: 0, top_k: 0 });
    await write({ temperature: 0.6 }); // do_sample absent: the values stand, as in vLLM
    assert.deepEqual(await readGenerationSampling(dir), { temperature: 0.6 });
    for (
      const [g, field] of [[{ repetition_penalty: 0 }, "repetition_penalty"], [
        { top_p: 1.5 },
        "top_p",
      ], [{ top_k: 2.5 }, "top_k"]] as const
    ) {
      await write(g);
      await assert.rejects(
        readGenerationSampling(dir),
        (e: unknown) => e instanceof ModelFormatError && e.message.includes(field),
      );
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
