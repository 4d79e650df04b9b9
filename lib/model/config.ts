// Hugging Face config.json → ModelConfig (zod-validated), plus generation_config.json eos ids.
// Covers the Llama/Mistral/Qwen2/Qwen3 decoder families and the RoPE variants the native engine
// implements (none, linear, llama3); everything else is refused with a ModelFormatError.
// It does not read files itself except in readModelConfig/readGenerationEosIds.

import { z } from "zod";
import { ModelFormatError, quote } from "./errors.ts";

/** Architectures (config.json `architectures[0]`) the engine implements. */
export type Architecture =
  | "LlamaForCausalLM"
  | "MistralForCausalLM"
  | "Qwen2ForCausalLM"
  | "Qwen3ForCausalLM";

/** RoPE frequency scaling (HF `rope_scaling`); null in ModelConfig means plain RoPE. */
export type RopeScaling =
  | { type: "linear"; factor: number }
  | {
    type: "llama3";
    factor: number;
    lowFreqFactor: number;
    highFreqFactor: number;
    originalMaxPosition: number;
  };

/** Geometry and options of a decoder-only checkpoint, normalized from config.json. */
export interface ModelConfig {
  architecture: Architecture;
  family: "llama" | "qwen2" | "qwen3";
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  /** config.head_dim, else hidden/heads (Qwen3: HF's class default 128 when absent). */
  headDim: number;
  rmsNormEps: number;
  ropeTheta: number;
  ropeScaling: RopeScaling | null;
  tieWordEmbeddings: boolean;
  /** q/k/v(/o) bias tensors present: always true for Qwen2 (q/k/v only). */
  attentionBias: boolean;
  /** gate/up/down bias tensors present (Llama `mlp_bias`). */
  mlpBias: boolean;
  maxPositionEmbeddings: number;
  bosTokenId: number | null;
  eosTokenIds: number[];
}

interface FamilyInfo {
  family: ModelConfig["family"];
  modelType: string;
  maxPosition: number; // HF config class default for max_position_embeddings
  headDimDefault: number | null; // HF class default for head_dim; null → hidden/heads
}

const FAMILIES: Record<Architecture, FamilyInfo> = {
  LlamaForCausalLM: {
    family: "llama",
    modelType: "llama",
    maxPosition: 2048,
    headDimDefault: null,
  },
  MistralForCausalLM: {
    family: "llama",
    modelType: "mistral",
    maxPosition: 32768,
    headDimDefault: null,
  },
  Qwen2ForCausalLM: {
    family: "qwen2",
    modelType: "qwen2",
    maxPosition: 32768,
    headDimDefault: null,
  },
  Qwen3ForCausalLM: {
    family: "qwen3",
    modelType: "qwen3",
    maxPosition: 32768,
    headDimDefault: 128,
  },
};

const U31 = 0x7fffffff; // dims cross the C ABI as u32 and token ids as i32
const dim = z.number().int().min(1).max(U31);
const tokenId = z.number().int().min(0).max(U31);
const posFinite = z.number().positive().finite();

const ropeObject = z.object({
  rope_type: z.string().optional(),
  type: z.string().optional(),
  factor: posFinite.optional(),
  low_freq_factor: posFinite.optional(),
  high_freq_factor: posFinite.optional(),
  original_max_position_embeddings: dim.optional(),
  rope_theta: posFinite.optional(),
});

const configSchema = z.object({
  architectures: z.array(z.string()).min(1),
  model_type: z.string().optional(),
  vocab_size: dim,
  hidden_size: dim,
  intermediate_size: dim,
  num_hidden_layers: dim,
  num_attention_heads: dim,
  num_key_value_heads: dim.nullable().optional(),
  head_dim: dim.nullable().optional(),
  hidden_act: z.string().optional(),
  rms_norm_eps: posFinite.optional(),
  rope_theta: posFinite.optional(),
  rope_scaling: ropeObject.nullable().optional(),
  rope_parameters: ropeObject.nullable().optional(), // transformers ≥ 5 spelling
  tie_word_embeddings: z.boolean().optional(),
  attention_bias: z.boolean().optional(),
  mlp_bias: z.boolean().optional(),
  max_position_embeddings: dim.optional(),
  bos_token_id: tokenId.nullable().optional(),
  eos_token_id: z.union([tokenId, z.array(tokenId)]).nullable().optional(),
  use_sliding_window: z.boolean().optional(),
  sliding_window: z.number().int().nullable().optional(),
  layer_types: z.array(z.string()).optional(),
});

function valueAt(json: unknown, path: PropertyKey[]): unknown {
  let v: unknown = json;
  for (const key of path) {
    if (v === null || typeof v !== "object") return undefined;
    v = (v as Record<PropertyKey, unknown>)[key];
  }
  return v;
}

function zodFailure(json: unknown, error: z.ZodError, source: string | undefined): never {
  const parts = error.issues.slice(0, 3).map((issue) => {
    const field = issue.path.map(String).join(".") || "(root)";
    const got = valueAt(json, issue.path);
    return `field "${field}": ${issue.message} (got ${got === undefined ? "nothing" : quote(got)})`;
  });
  throw new ModelFormatError(`invalid config: ${parts.join("; ")}`, source);
}

function parseRope(
  raw: z.infer<typeof ropeObject> | null | undefined,
  field: string,
  source: string | undefined,
): RopeScaling | null {
  if (raw === null || raw === undefined) return null;
  const kind = raw.rope_type ?? raw.type ?? "default";
  const need = (name: keyof typeof raw): number => {
    const v = raw[name];
    if (typeof v !== "number") {
      throw new ModelFormatError(
        `field "${field}.${name}" is required for rope type "${kind}"`,
        source,
      );
    }
    return v;
  };
  switch (kind) {
    case "default":
      return null;
    case "linear":
      return { type: "linear", factor: need("factor") };
    case "llama3": {
      const lowFreqFactor = need("low_freq_factor");
      const highFreqFactor = need("high_freq_factor");
      if (!(highFreqFactor > lowFreqFactor)) {
        throw new ModelFormatError(
          `field "${field}": high_freq_factor (${highFreqFactor}) must exceed low_freq_factor (${lowFreqFactor})`,
          source,
        );
      }
      return {
        type: "llama3",
        factor: need("factor"),
        lowFreqFactor,
        highFreqFactor,
        originalMaxPosition: need("original_max_position_embeddings"),
      };
    }
    default:
      throw new ModelFormatError(
        `unsupported rope type ${quote(kind)} in "${field}" (supported: default, linear, llama3)`,
        source,
      );
  }
}

/**
 * Validates a parsed config.json and normalizes it, applying the HF config-class defaults.
 * @param json the parsed config.json value
 * @param source file name used in error messages (e.g. ".../config.json")
 * @returns the normalized ModelConfig
 * @throws ModelFormatError naming the field and quoting the value when a field is missing or
 *   invalid, or when the architecture, activation, RoPE type or sliding-window attention is
 *   unsupported
 */
export function parseModelConfig(json: unknown, source?: string): ModelConfig {
  if (json === null || typeof json !== "object" || Array.isArray(json)) {
    throw new ModelFormatError(`config must be a JSON object, got ${quote(json)}`, source);
  }
  const parsed = configSchema.safeParse(json);
  if (!parsed.success) zodFailure(json, parsed.error, source);
  const c = parsed.data;

  const arch = c.architectures[0];
  if (!(arch in FAMILIES)) {
    throw new ModelFormatError(
      `unsupported architecture ${quote(arch)} (supported: ${Object.keys(FAMILIES).join(", ")})`,
      source,
    );
  }
  const architecture = arch as Architecture;
  const fam = FAMILIES[architecture];
  if (c.model_type !== undefined && c.model_type !== fam.modelType) {
    throw new ModelFormatError(
      `model_type ${quote(c.model_type)} does not match architecture ${quote(arch)} (expected ${
        quote(fam.modelType)
      })`,
      source,
    );
  }
  if (c.hidden_act !== undefined && c.hidden_act !== "silu") {
    throw new ModelFormatError(
      `unsupported hidden_act ${quote(c.hidden_act)} (only "silu")`,
      source,
    );
  }
  if (c.use_sliding_window === true) {
    throw new ModelFormatError(`unsupported: use_sliding_window is true`, source);
  }
  const slidingLayer = c.layer_types?.find((t) => t !== "full_attention");
  if (slidingLayer !== undefined) {
    throw new ModelFormatError(
      `unsupported layer type ${quote(slidingLayer)} in "layer_types"`,
      source,
    );
  }
  const maxPositionEmbeddings = c.max_position_embeddings ?? fam.maxPosition;
  // Mistral applies its window whenever set (HF MistralConfig default: 4096 when the key is absent).
  const window = architecture === "MistralForCausalLM"
    ? (c.sliding_window === undefined ? 4096 : c.sliding_window)
    : null;
  if (typeof window === "number" && window < maxPositionEmbeddings) {
    throw new ModelFormatError(
      `unsupported: sliding_window ${window}${
        c.sliding_window === undefined ? " (HF default)" : ""
      } < max_position_embeddings ${maxPositionEmbeddings}`,
      source,
    );
  }

  const numHeads = c.num_attention_heads;
  const numKvHeads = c.num_key_value_heads ?? numHeads;
  if (numHeads % numKvHeads !== 0) {
    throw new ModelFormatError(
      `num_attention_heads (${numHeads}) is not a multiple of num_key_value_heads (${numKvHeads})`,
      source,
    );
  }
  let headDim: number;
  if (c.head_dim !== undefined && c.head_dim !== null) headDim = c.head_dim;
  else if (fam.headDimDefault !== null) headDim = fam.headDimDefault;
  else {
    if (c.hidden_size % numHeads !== 0) {
      throw new ModelFormatError(
        `head_dim is absent and hidden_size (${c.hidden_size}) is not divisible by num_attention_heads (${numHeads})`,
        source,
      );
    }
    headDim = c.hidden_size / numHeads;
  }
  if (headDim % 2 !== 0) {
    throw new ModelFormatError(`head_dim ${headDim} must be even for rotate-half RoPE`, source);
  }

  const ropeField = c.rope_parameters ? "rope_parameters" : "rope_scaling";
  const ropeRaw = c.rope_parameters ?? c.rope_scaling;
  const ropeScaling = parseRope(ropeRaw, ropeField, source);
  const ropeTheta = c.rope_parameters?.rope_theta ?? c.rope_theta ?? 10000;

  const eos = c.eos_token_id;
  const eosTokenIds = eos === null || eos === undefined ? [] : Array.isArray(eos) ? eos : [eos];
  for (const id of [...eosTokenIds, c.bos_token_id ?? 0]) {
    if (id >= c.vocab_size) {
      throw new ModelFormatError(`special token id ${id} >= vocab_size ${c.vocab_size}`, source);
    }
  }

  return {
    architecture,
    family: fam.family,
    vocabSize: c.vocab_size,
    hiddenSize: c.hidden_size,
    intermediateSize: c.intermediate_size,
    numLayers: c.num_hidden_layers,
    numHeads,
    numKvHeads,
    headDim,
    rmsNormEps: c.rms_norm_eps ?? 1e-6,
    ropeTheta,
    ropeScaling,
    tieWordEmbeddings: c.tie_word_embeddings ?? false,
    attentionBias: fam.family === "qwen2"
      ? true
      : architecture === "MistralForCausalLM"
      ? false
      : (c.attention_bias ?? false),
    mlpBias: architecture === "LlamaForCausalLM" ? (c.mlp_bias ?? false) : false,
    maxPositionEmbeddings,
    bosTokenId: c.bos_token_id ?? null,
    eosTokenIds: [...new Set(eosTokenIds)],
  };
}

async function readJson(path: string): Promise<unknown> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    throw new ModelFormatError(`cannot read: ${(e as Error).message}`, path);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ModelFormatError(`invalid JSON: ${(e as Error).message}`, path);
  }
}

/**
 * Reads and parses `<dir>/config.json`.
 * @param dir checkpoint directory
 * @returns the ModelConfig (eos ids from config.json only)
 * @throws ModelFormatError when the file is missing, not JSON or invalid
 */
export async function readModelConfig(dir: string): Promise<ModelConfig> {
  const path = `${dir}/config.json`;
  return parseModelConfig(await readJson(path), path);
}

/**
 * Reads `eos_token_id` (number or array) from `<dir>/generation_config.json` if the file exists.
 * @param dir checkpoint directory
 * @param vocabSize ids must be below this
 * @returns the ids (empty when the file or field is absent)
 * @throws ModelFormatError when the file exists but is malformed or an id is out of range
 */
export async function readGenerationEosIds(dir: string, vocabSize: number): Promise<number[]> {
  const path = `${dir}/generation_config.json`;
  try {
    await Deno.stat(path);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return [];
    throw new ModelFormatError(`cannot stat: ${(e as Error).message}`, path);
  }
  const json = await readJson(path);
  const schema = z.object({
    eos_token_id: z.union([tokenId, z.array(tokenId)]).nullable().optional(),
  });
  const parsed = schema.safeParse(json);
  if (!parsed.success) zodFailure(json, parsed.error, path);
  const eos = parsed.data.eos_token_id;
  const ids = eos === null || eos === undefined ? [] : Array.isArray(eos) ? eos : [eos];
  for (const id of ids) {
    if (id >= vocabSize) {
      throw new ModelFormatError(`eos_token_id ${id} >= vocab_size ${vocabSize}`, path);
    }
  }
  return ids;
}

/** Sampling defaults a checkpoint's generation_config.json gives (the fields vLLM reads). */
export interface GenerationSampling {
  /** 0 = greedy (also what `do_sample: false` means). */
  temperature?: number;
  top_p?: number;
  /** 0 = off. */
  top_k?: number;
  min_p?: number;
  repetition_penalty?: number;
}

const generationSamplingSchema = z.object({
  do_sample: z.boolean().nullable().optional(),
  temperature: z.number().min(0).nullable().optional(),
  top_p: z.number().gt(0).max(1).nullable().optional(),
  // transformers: 0 = off; vLLM: -1 = off.
  top_k: z.number().int().min(-1).nullable().optional(),
  min_p: z.number().min(0).max(1).nullable().optional(),
  repetition_penalty: z.number().gt(0).nullable().optional(),
});

/**
 * Reads the sampling defaults of `<dir>/generation_config.json`, as vLLM does: temperature,
 * top_p, top_k, min_p and repetition_penalty when present (null = absent), and `do_sample: false`
 * (stated, not defaulted) as temperature 0 — greedy, the way transformers reads it.
 * @param dir checkpoint directory
 * @returns the fields present (empty when the file is absent)
 * @throws ModelFormatError when the file exists but is malformed or a value is out of range
 */
export async function readGenerationSampling(dir: string): Promise<GenerationSampling> {
  const path = `${dir}/generation_config.json`;
  try {
    await Deno.stat(path);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return {};
    throw new ModelFormatError(`cannot stat: ${(e as Error).message}`, path);
  }
  const json = await readJson(path);
  const parsed = generationSamplingSchema.safeParse(json);
  if (!parsed.success) zodFailure(json, parsed.error, path);
  const g = parsed.data;
  const out: GenerationSampling = {};
  if (g.temperature != null) out.temperature = g.temperature;
  if (g.top_p != null) out.top_p = g.top_p;
  if (g.top_k != null) out.top_k = Math.max(0, g.top_k);
  if (g.min_p != null) out.min_p = g.min_p;
  if (g.repetition_penalty != null) out.repetition_penalty = g.repetition_penalty;
  if (g.do_sample === false) out.temperature = 0;
  return out;
}
