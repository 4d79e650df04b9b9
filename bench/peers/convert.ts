// Hugging Face checkpoint (Llama / Qwen2 / Qwen3, safetensors F32/F16/BF16) → GGUF for llama.cpp,
// following convert_hf_to_gguf.py: llama.cpp tensor names and metadata keys, Llama's q/k rows
// permuted from HF's rotate-half RoPE layout to llama.cpp's interleaved one, a rope_freqs tensor
// for llama3 RoPE scaling, 1-D tensors kept F32, and the tokenizer as a gpt2-style BPE vocabulary
// + merges from tokenizer.json. Also writes an F32 copy of a safetensors checkpoint (kvrelay's
// "f32 weights" side). It converts; it does not run either engine.

import { type Checkpoint, encodeSafetensors, readTensorBytes } from "../../lib/model/mod.ts";
import { f16Bits, type GgmlTypeName, type GgufTensor, type GgufValue } from "./gguf.ts";
import { quantizeQ4_0, quantizeQ8_0, writeGguf } from "./gguf.ts";

/** Weight types a GGUF can be written in (2-D tensors; 1-D stay F32). */
export type GgufWeightType = "F32" | "F16" | "BF16" | "Q8_0" | "Q4_0";

const ARCH: Record<string, string> = {
  LlamaForCausalLM: "llama",
  MistralForCausalLM: "llama",
  Qwen2ForCausalLM: "qwen2",
  Qwen3ForCausalLM: "qwen3",
};

// llama_ftype (llama.h) of each weight type, for general.file_type.
const FILE_TYPE: Record<GgufWeightType, number> = { F32: 0, F16: 1, Q4_0: 2, Q8_0: 7, BF16: 32 };

/**
 * The llama.cpp name of a transformers tensor.
 * @param name HF name, e.g. model.layers.3.self_attn.q_proj.weight
 * @returns GGUF name, e.g. blk.3.attn_q.weight
 * @throws RangeError for a tensor llama.cpp has no name for
 */
export function ggufTensorName(name: string): string {
  const fixed: Record<string, string> = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
  };
  if (name in fixed) return fixed[name];
  const m = name.match(/^model\.layers\.(\d+)\.(.+)\.(weight|bias)$/);
  const parts: Record<string, string> = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
  };
  if (!m || !(m[2] in parts)) throw new RangeError(`no llama.cpp name for tensor "${name}"`);
  return `blk.${m[1]}.${parts[m[2]]}.${m[3]}`;
}

/** Decodes safetensors F32/F16/BF16 bytes to float32 (exact: every source value is a float32). */
export function toFloat32(bytes: Uint8Array, dtype: string): Float32Array {
  if (dtype === "F32") return new Float32Array(bytes.slice().buffer);
  const n = bytes.length / 2;
  const src = new Uint16Array(bytes.slice().buffer);
  const out = new Float32Array(n);
  if (dtype === "BF16") {
    const bits = new Uint32Array(out.buffer);
    for (let i = 0; i < n; i++) bits[i] = src[i] << 16;
    return out;
  }
  if (dtype === "F16") {
    const h = new Float16Array(src.buffer);
    for (let i = 0; i < n; i++) out[i] = h[i];
    return out;
  }
  throw new RangeError(`unsupported safetensors dtype ${dtype}`);
}

function encode(values: Float32Array, type: GgmlTypeName): Uint8Array {
  if (type === "F32") return new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  if (type === "Q8_0") return quantizeQ8_0(values);
  if (type === "Q4_0") return quantizeQ4_0(values);
  const out = new Uint16Array(values.length);
  if (type === "BF16") {
    const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
    for (let i = 0; i < out.length; i++) {
      const b = bits[i];
      out[i] = (b & 0x7fffffff) > 0x7f800000 ? 0x7fc0 : (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
    }
  } else {
    for (let i = 0; i < out.length; i++) out[i] = f16Bits(values[i]);
  }
  return new Uint8Array(out.buffer);
}

/**
 * Reorders the rows of a q/k projection (weight (heads·d, in) or bias (heads·d)) from HF's
 * rotate-half layout to llama.cpp's interleaved RoPE pairs, as convert_hf_to_gguf's permute:
 * within each head, new row 2j + s = old row s·d/2 + j (s ∈ {0, 1}).
 * @param bytes row-major bytes
 * @param rows heads · head_dim
 * @param heads head count
 * @returns permuted copy
 */
export function permuteRopeRows(bytes: Uint8Array, rows: number, heads: number): Uint8Array {
  const rowBytes = bytes.length / rows;
  const d = rows / heads;
  const out = new Uint8Array(bytes.length);
  for (let h = 0; h < heads; h++) {
    for (let j = 0; j < d / 2; j++) {
      for (let s = 0; s < 2; s++) {
        const from = (h * d + s * (d / 2) + j) * rowBytes;
        const to = (h * d + 2 * j + s) * rowBytes;
        out.set(bytes.subarray(from, from + rowBytes), to);
      }
    }
  }
  return out;
}

/**
 * llama3 RoPE scaling as per-frequency divisors (convert_hf_to_gguf's rope_freqs tensor).
 * @param cfg the checkpoint config
 * @returns head_dim/2 factors, or null when the model has no llama3 scaling
 */
export function llama3RopeFactors(cfg: Checkpoint["config"]): Float32Array | null {
  const rs = cfg.ropeScaling;
  if (rs?.type !== "llama3") return null;
  const d = cfg.headDim;
  const out = new Float32Array(d / 2);
  const lowWavelen = rs.originalMaxPosition / rs.lowFreqFactor;
  const highWavelen = rs.originalMaxPosition / rs.highFreqFactor;
  for (let i = 0; i < d / 2; i++) {
    const freq = 1 / cfg.ropeTheta ** ((2 * i) / d);
    const wavelen = (2 * Math.PI) / freq;
    if (wavelen < highWavelen) out[i] = 1;
    else if (wavelen > lowWavelen) out[i] = rs.factor;
    else {
      const smooth = (rs.originalMaxPosition / wavelen - rs.lowFreqFactor) /
        (rs.highFreqFactor - rs.lowFreqFactor);
      out[i] = 1 / ((1 - smooth) / rs.factor + smooth);
    }
  }
  return out;
}

interface TokenizerJson {
  added_tokens?: { id: number; content: string; special?: boolean }[];
  pre_tokenizer?: unknown;
  model: { type: string; vocab: Record<string, number>; merges: (string | [string, string])[] };
}

// Pre-tokenizer regexes llama.cpp knows by name (llama-vocab.cpp's tokenizer.ggml.pre values).
const QWEN2_REGEX =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const LLAMA3_REGEX =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/**
 * The tokenizer.ggml.pre name of a byte-level BPE tokenizer.json's pre-tokenizer.
 * @param pre tokenizer.json pre_tokenizer
 * @returns "gpt-2", "qwen2" or "llama-bpe"
 * @throws RangeError for a pre-tokenizer llama.cpp would not reproduce
 */
export function preTokenizerName(pre: unknown): string {
  const p = pre as {
    type?: string;
    use_regex?: boolean;
    pretokenizers?: { type: string; pattern?: { Regex?: string } }[];
  };
  if (p?.type === "ByteLevel" && p.use_regex !== false) return "gpt-2";
  if (p?.type === "Sequence" && p.pretokenizers?.[0]?.type === "Split") {
    const regex = p.pretokenizers[0].pattern?.Regex;
    if (regex === QWEN2_REGEX) return "qwen2";
    if (regex === LLAMA3_REGEX) return "llama-bpe";
  }
  throw new RangeError(
    `pre-tokenizer not known to llama.cpp: ${JSON.stringify(pre).slice(0, 200)}`,
  );
}

/**
 * gpt2-style tokenizer metadata from tokenizer.json: one token per id up to vocab_size (ids the
 * tokenizer lacks become "[PAD<id>]", type UNUSED), types NORMAL / CONTROL (special added tokens) /
 * USER_DEFINED, merges as "a b".
 * @param tok parsed tokenizer.json (BPE)
 * @param vocabSize the model's vocab_size
 * @param bos bos id or null; @param eos eos id
 * @returns metadata entries
 */
export function tokenizerMetadata(
  tok: TokenizerJson,
  vocabSize: number,
  bos: number | null,
  eos: number,
): [string, GgufValue][] {
  if (tok.model.type !== "BPE") {
    throw new RangeError(`tokenizer model ${tok.model.type} is not BPE`);
  }
  const tokens: string[] = Array.from({ length: vocabSize }, (_, i) => `[PAD${i}]`);
  const types = new Int32Array(vocabSize).fill(5); // UNUSED
  for (const [piece, id] of Object.entries(tok.model.vocab)) {
    if (id >= vocabSize) throw new RangeError(`token id ${id} ≥ vocab_size ${vocabSize}`);
    tokens[id] = piece;
    types[id] = 1; // NORMAL
  }
  for (const a of tok.added_tokens ?? []) {
    if (a.id >= vocabSize) throw new RangeError(`added token id ${a.id} ≥ vocab_size ${vocabSize}`);
    tokens[a.id] = a.content;
    types[a.id] = a.special ? 3 : 4; // CONTROL : USER_DEFINED
  }
  const merges = tok.model.merges.map((m) => typeof m === "string" ? m : `${m[0]} ${m[1]}`);
  const meta: [string, GgufValue][] = [
    ["tokenizer.ggml.model", { type: "string", value: "gpt2" }],
    ["tokenizer.ggml.pre", { type: "string", value: preTokenizerName(tok.pre_tokenizer) }],
    ["tokenizer.ggml.tokens", { type: "string[]", value: tokens }],
    ["tokenizer.ggml.token_type", { type: "i32[]", value: types }],
    ["tokenizer.ggml.merges", { type: "string[]", value: merges }],
    ["tokenizer.ggml.eos_token_id", { type: "u32", value: eos }],
    ["tokenizer.ggml.add_bos_token", { type: "bool", value: false }],
  ];
  if (bos !== null) meta.push(["tokenizer.ggml.bos_token_id", { type: "u32", value: bos }]);
  return meta;
}

/**
 * Writes a checkpoint as GGUF.
 * @param ckpt loaded checkpoint (lib/model)
 * @param out GGUF path
 * @param weightType type of the 2-D weights
 * @returns bytes written
 * @throws RangeError for an architecture, tensor or tokenizer this converter does not handle
 */
export async function convertToGguf(
  ckpt: Checkpoint,
  out: string,
  weightType: GgufWeightType,
): Promise<number> {
  const cfg = ckpt.config;
  const arch = ARCH[cfg.architecture];
  if (!arch) throw new RangeError(`no GGUF architecture for ${cfg.architecture}`);
  if (cfg.ropeScaling?.type === "linear" || cfg.mlpBias) {
    throw new RangeError("linear RoPE scaling and MLP bias are not converted (not needed here)");
  }
  const tok = JSON.parse(await Deno.readTextFile(`${ckpt.dir}/tokenizer.json`)) as TokenizerJson;
  const eos = cfg.eosTokenIds[0];
  if (eos === undefined) throw new RangeError("config has no eos_token_id");
  const u32 = (value: number): GgufValue => ({ type: "u32", value });
  const f32 = (value: number): GgufValue => ({ type: "f32", value });
  const meta: [string, GgufValue][] = [
    ["general.architecture", { type: "string", value: arch }],
    ["general.name", { type: "string", value: ckpt.dir.split("/").filter(Boolean).pop()! }],
    ["general.file_type", u32(FILE_TYPE[weightType])],
    [`${arch}.context_length`, u32(cfg.maxPositionEmbeddings)],
    [`${arch}.embedding_length`, u32(cfg.hiddenSize)],
    [`${arch}.block_count`, u32(cfg.numLayers)],
    [`${arch}.feed_forward_length`, u32(cfg.intermediateSize)],
    [`${arch}.attention.head_count`, u32(cfg.numHeads)],
    [`${arch}.attention.head_count_kv`, u32(cfg.numKvHeads)],
    [`${arch}.attention.key_length`, u32(cfg.headDim)],
    [`${arch}.attention.value_length`, u32(cfg.headDim)],
    [`${arch}.rope.dimension_count`, u32(cfg.headDim)],
    [`${arch}.rope.freq_base`, f32(cfg.ropeTheta)],
    [`${arch}.attention.layer_norm_rms_epsilon`, f32(cfg.rmsNormEps)],
    [`${arch}.vocab_size`, u32(cfg.vocabSize)],
    ...tokenizerMetadata(tok, cfg.vocabSize, cfg.bosTokenId, eos),
  ];
  const permute = arch === "llama";
  const tensors: GgufTensor[] = [];
  for (const t of ckpt.tensors.values()) {
    const name = ggufTensorName(t.name);
    const dims = [...t.shape].reverse();
    const type: GgmlTypeName = dims.length === 1 ? "F32" : weightType;
    const qk = permute && /self_attn\.[qk]_proj\./.test(t.name);
    const heads = t.name.includes("q_proj") ? cfg.numHeads : cfg.numKvHeads;
    tensors.push({
      name,
      dims,
      type,
      data: async () => {
        let bytes = await readTensorBytes(t);
        if (qk) bytes = permuteRopeRows(bytes, t.shape[0], heads);
        if (t.dtype === type) return bytes; // F32→F32, BF16→BF16, F16→F16: bit copy
        return encode(toFloat32(bytes, t.dtype), type);
      },
    });
  }
  const factors = llama3RopeFactors(cfg);
  if (factors) {
    tensors.push({
      name: "rope_freqs.weight",
      dims: [factors.length],
      type: "F32",
      data: () => new Uint8Array(factors.buffer),
    });
  }
  return await writeGguf(out, meta, tensors);
}

/**
 * Copies a checkpoint directory with every tensor widened to F32 (config.json's torch_dtype
 * becomes float32; tokenizer files copied). Small models only: holds one tensor at a time but
 * writes the file in one piece.
 * @param ckpt source checkpoint
 * @param dir target directory (created)
 */
export async function writeF32Copy(ckpt: Checkpoint, dir: string): Promise<void> {
  await Deno.mkdir(dir, { recursive: true });
  const config = JSON.parse(await Deno.readTextFile(`${ckpt.dir}/config.json`));
  config.torch_dtype = "float32";
  await Deno.writeTextFile(`${dir}/config.json`, JSON.stringify(config, null, 2));
  for (const f of ["generation_config.json", "tokenizer.json", "tokenizer_config.json"]) {
    await Deno.copyFile(`${ckpt.dir}/${f}`, `${dir}/${f}`).catch(() => {});
  }
  const entries = [];
  for (const t of ckpt.tensors.values()) {
    const values = toFloat32(await readTensorBytes(t), t.dtype);
    entries.push({
      name: t.name,
      dtype: "F32" as const,
      shape: t.shape,
      data: new Uint8Array(values.buffer),
    });
  }
  await Deno.writeFile(`${dir}/model.safetensors`, encodeSafetensors(entries));
}
