// Hugging Face tensor names → weight roles (+ layer), with the shape each role must have for a
// ModelConfig and the set of roles a config requires. Pure: no files, no FFI. The numeric
// kvr_tensor_role codes live in lib/native (the ABI mirror); here roles are names.

import { ModelFormatError, quote } from "./errors.ts";
import type { ModelConfig } from "./config.ts";
import type { TensorInfo } from "./safetensors.ts";

/** What a weight tensor is; per-layer roles come with a layer index. */
export type WeightRole =
  | "embed"
  | "final_norm"
  | "lm_head"
  | "attn_norm"
  | "q"
  | "k"
  | "v"
  | "o"
  | "q_bias"
  | "k_bias"
  | "v_bias"
  | "o_bias"
  | "q_norm"
  | "k_norm"
  | "mlp_norm"
  | "gate"
  | "up"
  | "down"
  | "gate_bias"
  | "up_bias"
  | "down_bias";

/** A checkpoint tensor with its role; layer is 0 for non-layer roles. */
export interface WeightEntry {
  role: WeightRole;
  layer: number;
  tensor: TensorInfo;
}

const GLOBAL_NAMES: Record<string, WeightRole> = {
  "model.embed_tokens.weight": "embed",
  "model.norm.weight": "final_norm",
  "lm_head.weight": "lm_head",
};

const LAYER_SUFFIXES: Record<string, WeightRole> = {
  "input_layernorm.weight": "attn_norm",
  "self_attn.q_proj.weight": "q",
  "self_attn.k_proj.weight": "k",
  "self_attn.v_proj.weight": "v",
  "self_attn.o_proj.weight": "o",
  "self_attn.q_proj.bias": "q_bias",
  "self_attn.k_proj.bias": "k_bias",
  "self_attn.v_proj.bias": "v_bias",
  "self_attn.o_proj.bias": "o_bias",
  "self_attn.q_norm.weight": "q_norm",
  "self_attn.k_norm.weight": "k_norm",
  "post_attention_layernorm.weight": "mlp_norm",
  "mlp.gate_proj.weight": "gate",
  "mlp.up_proj.weight": "up",
  "mlp.down_proj.weight": "down",
  "mlp.gate_proj.bias": "gate_bias",
  "mlp.up_proj.bias": "up_bias",
  "mlp.down_proj.bias": "down_bias",
};

/** Buffers some exporters save that carry no weights (recomputed from the config). */
const HARMLESS = /^model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq$/;

const LAYER_ROLES = new Set<WeightRole>(Object.values(LAYER_SUFFIXES));

/**
 * Classifies one HF tensor name.
 * @param name e.g. "model.layers.3.self_attn.q_proj.weight"
 * @returns {role, layer}, "skip" for harmless non-weights (rotary inv_freq), or null if unknown
 */
export function classifyTensorName(
  name: string,
): { role: WeightRole; layer: number } | "skip" | null {
  if (HARMLESS.test(name)) return "skip";
  const global = GLOBAL_NAMES[name];
  if (global) return { role: global, layer: 0 };
  const m = /^model\.layers\.(0|[1-9]\d{0,8})\.(.+)$/.exec(name);
  if (!m) return null;
  const role = LAYER_SUFFIXES[m[2]];
  return role ? { role, layer: Number(m[1]) } : null;
}

/**
 * The shape a role must have under a config.
 * @param config model geometry
 * @param role the weight role
 * @returns the expected shape, e.g. [heads*head_dim, hidden] for "q"
 */
export function expectedShape(config: ModelConfig, role: WeightRole): number[] {
  const { vocabSize: V, hiddenSize: H, intermediateSize: I, headDim: D } = config;
  const Q = config.numHeads * D, KV = config.numKvHeads * D;
  switch (role) {
    case "embed":
    case "lm_head":
      return [V, H];
    case "final_norm":
    case "attn_norm":
    case "mlp_norm":
    case "o_bias":
    case "down_bias":
      return [H];
    case "q":
      return [Q, H];
    case "k":
    case "v":
      return [KV, H];
    case "o":
      return [H, Q];
    case "q_bias":
      return [Q];
    case "k_bias":
    case "v_bias":
      return [KV];
    case "q_norm":
    case "k_norm":
      return [D];
    case "gate":
    case "up":
      return [I, H];
    case "down":
      return [H, I];
    case "gate_bias":
    case "up_bias":
      return [I];
  }
}

/**
 * Roles every layer must have under a config (exactly these, no others).
 * @param config model geometry and options
 * @returns the per-layer role list
 */
export function requiredLayerRoles(config: ModelConfig): WeightRole[] {
  const roles: WeightRole[] = ["attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down"];
  if (config.family === "qwen3") roles.push("q_norm", "k_norm");
  if (config.attentionBias) {
    roles.push("q_bias", "k_bias", "v_bias");
    if (config.family !== "qwen2") roles.push("o_bias");
  }
  if (config.mlpBias) roles.push("gate_bias", "up_bias", "down_bias");
  return roles;
}

function hfName(role: WeightRole, layer: number): string {
  for (const [name, r] of Object.entries(GLOBAL_NAMES)) if (r === role) return name;
  for (const [suffix, r] of Object.entries(LAYER_SUFFIXES)) {
    if (r === role) return `model.layers.${layer}.${suffix}`;
  }
  return role;
}

/**
 * Maps a checkpoint's tensors to roles and checks them against the config: no unknown names,
 * no tensors the config does not use, every required tensor present once, shapes as expected.
 * With tied embeddings a stored lm_head.weight is ignored.
 * @param config the model config
 * @param tensors all tensors of the checkpoint by name
 * @param source file or directory named in errors
 * @returns entries ordered: embed, layers 0..L-1 (required-role order), final_norm, lm_head
 * @throws ModelFormatError naming the tensor (and quoting shapes) on any mismatch
 */
export function mapWeights(
  config: ModelConfig,
  tensors: Map<string, TensorInfo>,
  source?: string,
): WeightEntry[] {
  const layerRoles = requiredLayerRoles(config);
  const allowed = new Set(layerRoles);
  const found = new Map<string, WeightEntry>(); // key "role@layer"
  for (const [name, tensor] of tensors) {
    const cls = classifyTensorName(name);
    if (cls === "skip") continue;
    if (cls === null) {
      throw new ModelFormatError(`unknown tensor name ${quote(name)}`, source);
    }
    if (cls.role === "lm_head" && config.tieWordEmbeddings) continue;
    if (LAYER_ROLES.has(cls.role)) {
      if (cls.layer >= config.numLayers) {
        throw new ModelFormatError(
          `tensor ${quote(name)}: layer ${cls.layer} >= num_hidden_layers ${config.numLayers}`,
          source,
        );
      }
      if (!allowed.has(cls.role)) {
        throw new ModelFormatError(
          `unexpected tensor ${
            quote(name)
          } for ${config.architecture} (attention_bias=${config.attentionBias}, mlp_bias=${config.mlpBias})`,
          source,
        );
      }
    }
    const want = expectedShape(config, cls.role);
    if (tensor.shape.length !== want.length || tensor.shape.some((d, i) => d !== want[i])) {
      throw new ModelFormatError(
        `tensor ${quote(name)} has shape ${quote(tensor.shape)}, expected ${quote(want)}`,
        source,
      );
    }
    found.set(`${cls.role}@${cls.layer}`, { role: cls.role, layer: cls.layer, tensor });
  }
  const out: WeightEntry[] = [];
  const take = (role: WeightRole, layer: number) => {
    const e = found.get(`${role}@${layer}`);
    if (!e) {
      throw new ModelFormatError(`missing tensor ${quote(hfName(role, layer))}`, source);
    }
    out.push(e);
  };
  take("embed", 0);
  for (let l = 0; l < config.numLayers; l++) for (const r of layerRoles) take(r, l);
  take("final_norm", 0);
  if (!config.tieWordEmbeddings) take("lm_head", 0);
  return out;
}
