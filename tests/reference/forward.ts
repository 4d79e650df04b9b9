// The float64 reference forward pass: the oracle the native engine is tested against. Plain loops,
// one token and one head at a time, following the transformers implementations of Llama, Mistral,
// Qwen2 and Qwen3 (rotate-half RoPE, RMSNorm, GQA, SwiGLU). It reads config.json and safetensors
// itself (./safetensors.ts) and shares no code with lib/model or the native library. Not fast.

import { readCheckpointWeights, type Tensor64 } from "./safetensors.ts";

/** RoPE frequency scaling, as in transformers' `rope_scaling` (linear or llama3). */
export type RefRopeScaling =
  | { type: "linear"; factor: number }
  | {
    type: "llama3";
    factor: number;
    lowFreqFactor: number;
    highFreqFactor: number;
    originalMaxPosition: number;
  };

/** Everything in config.json that shapes the computation, with transformers' defaults applied. */
export interface RefConfig {
  architecture: "LlamaForCausalLM" | "MistralForCausalLM" | "Qwen2ForCausalLM" | "Qwen3ForCausalLM";
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  rmsNormEps: number;
  ropeTheta: number;
  ropeScaling: RefRopeScaling | null;
  tieWordEmbeddings: boolean;
  /** q/k/v biases present (Qwen2 always; Llama/Qwen3 when attention_bias). */
  qkvBias: boolean;
  /** o_proj bias present (Llama/Qwen3 when attention_bias; never Qwen2/Mistral). */
  oBias: boolean;
  /** gate/up/down biases (Llama mlp_bias only). */
  mlpBias: boolean;
  /** Qwen3 per-head RMSNorm of q and k over head_dim, before RoPE. */
  qkNorm: boolean;
  /** Mistral sliding window (null = full causal attention). */
  slidingWindow: number | null;
}

/** A reference model: its config and every weight as float64. */
export interface RefModel {
  config: RefConfig;
  weights: Map<string, Tensor64>;
}

/**
 * Reads a config.json object the way transformers does for the four supported architectures.
 * @param json parsed config.json
 * @returns the reference config
 * @throws Error on an unsupported architecture, activation or rope_scaling type
 */
export function refConfigFromJson(json: Record<string, unknown>): RefConfig {
  const arch = (json.architectures as string[] | undefined)?.[0];
  if (
    arch !== "LlamaForCausalLM" && arch !== "MistralForCausalLM" &&
    arch !== "Qwen2ForCausalLM" && arch !== "Qwen3ForCausalLM"
  ) throw new Error(`reference: unsupported architecture ${JSON.stringify(arch)}`);
  const act = json.hidden_act ?? "silu";
  if (act !== "silu") throw new Error(`reference: unsupported hidden_act ${JSON.stringify(act)}`);
  const num = (key: string, fallback?: number): number => {
    const v = json[key] ?? fallback;
    if (typeof v !== "number") throw new Error(`reference: config.${key} = ${JSON.stringify(v)}`);
    return v;
  };
  const hiddenSize = num("hidden_size");
  const numHeads = num("num_attention_heads");
  const attentionBias = json.attention_bias === true;
  let ropeScaling: RefRopeScaling | null = null;
  const rs = json.rope_scaling as Record<string, unknown> | null | undefined;
  if (rs) {
    const type = rs.rope_type ?? rs.type;
    if (type === "linear") ropeScaling = { type: "linear", factor: rs.factor as number };
    else if (type === "llama3") {
      ropeScaling = {
        type: "llama3",
        factor: rs.factor as number,
        lowFreqFactor: rs.low_freq_factor as number,
        highFreqFactor: rs.high_freq_factor as number,
        originalMaxPosition: rs.original_max_position_embeddings as number,
      };
    } else if (type !== "default") {
      throw new Error(`reference: unsupported rope_scaling type ${JSON.stringify(type)}`);
    }
  }
  const isLlama = arch === "LlamaForCausalLM";
  const isQwen2 = arch === "Qwen2ForCausalLM";
  const isQwen3 = arch === "Qwen3ForCausalLM";
  const sw = json.sliding_window;
  const useSw = arch === "MistralForCausalLM" ||
    (json.use_sliding_window === true && (isQwen2 || isQwen3));
  return {
    architecture: arch,
    vocabSize: num("vocab_size"),
    hiddenSize,
    intermediateSize: num("intermediate_size"),
    numLayers: num("num_hidden_layers"),
    numHeads,
    numKvHeads: num("num_key_value_heads", numHeads),
    headDim: typeof json.head_dim === "number" ? json.head_dim : hiddenSize / numHeads,
    rmsNormEps: num("rms_norm_eps", 1e-6),
    ropeTheta: num("rope_theta", 10000),
    ropeScaling,
    tieWordEmbeddings: json.tie_word_embeddings === true,
    qkvBias: isQwen2 || ((isLlama || isQwen3) && attentionBias),
    oBias: (isLlama || isQwen3) && attentionBias,
    mlpBias: isLlama && json.mlp_bias === true,
    qkNorm: isQwen3,
    slidingWindow: useSw && typeof sw === "number" ? sw : null,
  };
}

/**
 * Loads config.json and all safetensors weights of a checkpoint directory.
 * @param dir checkpoint directory
 * @returns config + float64 weights
 * @throws Error when a weight the architecture needs is missing or one it doesn't use is present
 */
export async function loadReferenceModel(dir: string): Promise<RefModel> {
  const config = refConfigFromJson(JSON.parse(await Deno.readTextFile(`${dir}/config.json`)));
  const model = { config, weights: await readCheckpointWeights(dir) };
  checkWeights(model);
  return model;
}

/** The weight names (and shapes) the architecture uses, per transformers' modules. */
export function expectedWeights(c: RefConfig): Map<string, number[]> {
  const q = c.numHeads * c.headDim, kv = c.numKvHeads * c.headDim;
  const h = c.hiddenSize, f = c.intermediateSize;
  const w = new Map<string, number[]>();
  w.set("model.embed_tokens.weight", [c.vocabSize, h]);
  w.set("model.norm.weight", [h]);
  if (!c.tieWordEmbeddings) w.set("lm_head.weight", [c.vocabSize, h]);
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`;
    w.set(p + "input_layernorm.weight", [h]);
    w.set(p + "post_attention_layernorm.weight", [h]);
    w.set(p + "self_attn.q_proj.weight", [q, h]);
    w.set(p + "self_attn.k_proj.weight", [kv, h]);
    w.set(p + "self_attn.v_proj.weight", [kv, h]);
    w.set(p + "self_attn.o_proj.weight", [h, q]);
    if (c.qkvBias) {
      w.set(p + "self_attn.q_proj.bias", [q]);
      w.set(p + "self_attn.k_proj.bias", [kv]);
      w.set(p + "self_attn.v_proj.bias", [kv]);
    }
    if (c.oBias) w.set(p + "self_attn.o_proj.bias", [h]);
    if (c.qkNorm) {
      w.set(p + "self_attn.q_norm.weight", [c.headDim]);
      w.set(p + "self_attn.k_norm.weight", [c.headDim]);
    }
    w.set(p + "mlp.gate_proj.weight", [f, h]);
    w.set(p + "mlp.up_proj.weight", [f, h]);
    w.set(p + "mlp.down_proj.weight", [h, f]);
    if (c.mlpBias) {
      w.set(p + "mlp.gate_proj.bias", [f]);
      w.set(p + "mlp.up_proj.bias", [f]);
      w.set(p + "mlp.down_proj.bias", [h]);
    }
  }
  return w;
}

/** Throws unless the weights are exactly the expected names with the expected shapes. */
export function checkWeights(model: RefModel): void {
  const expected = expectedWeights(model.config);
  for (const [name, shape] of expected) {
    const t = model.weights.get(name);
    if (!t) throw new Error(`reference: missing weight ${name}`);
    if (t.shape.join(",") !== shape.join(",")) {
      throw new Error(`reference: ${name} has shape [${t.shape}], expected [${shape}]`);
    }
  }
  for (const name of model.weights.keys()) {
    if (!expected.has(name)) throw new Error(`reference: unexpected weight ${name}`);
  }
}

/**
 * RoPE inverse frequencies, transformers convention: inv_freq[i] = theta^(-2i/d), i < d/2, then
 * rope_scaling (linear: inv_freq / factor; llama3: `_compute_llama3_parameters`).
 * @param headDim d (even)
 * @param theta rope_theta
 * @param scaling rope_scaling or null
 * @returns (d/2) radians per position
 */
export function ropeInvFreq(
  headDim: number,
  theta: number,
  scaling: RefRopeScaling | null,
): Float64Array {
  const half = headDim / 2;
  const invFreq = new Float64Array(half);
  for (let i = 0; i < half; i++) invFreq[i] = theta ** (-(2 * i) / headDim);
  if (scaling?.type === "linear") {
    for (let i = 0; i < half; i++) invFreq[i] /= scaling.factor;
  } else if (scaling?.type === "llama3") {
    const { factor, lowFreqFactor, highFreqFactor, originalMaxPosition } = scaling;
    const lowFreqWavelen = originalMaxPosition / lowFreqFactor;
    const highFreqWavelen = originalMaxPosition / highFreqFactor;
    for (let i = 0; i < half; i++) {
      const wavelen = (2 * Math.PI) / invFreq[i];
      if (wavelen > lowFreqWavelen) {
        invFreq[i] = invFreq[i] / factor; // low frequencies: fully scaled
      } else if (wavelen >= highFreqWavelen) {
        // medium band: interpolate between scaled and unscaled
        const smooth = (originalMaxPosition / wavelen - lowFreqFactor) /
          (highFreqFactor - lowFreqFactor);
        invFreq[i] = (1 - smooth) * invFreq[i] / factor + smooth * invFreq[i];
      } // high frequencies (wavelen < highFreqWavelen): unchanged
    }
  }
  return invFreq;
}

/**
 * Rotate-half RoPE on one head vector, in place: for i < d/2 the pair (x[i], x[i + d/2]) is
 * rotated by angle pos · invFreq[i].
 * @param x (head_dim) one head of q or k
 * @param pos token position
 * @param invFreq (head_dim/2) from ropeInvFreq
 */
export function applyRope(x: Float64Array, pos: number, invFreq: Float64Array): void {
  const half = invFreq.length;
  for (let i = 0; i < half; i++) {
    const angle = pos * invFreq[i];
    const cos = Math.cos(angle), sin = Math.sin(angle);
    const a = x[i], b = x[i + half];
    x[i] = a * cos - b * sin;
    x[i + half] = b * cos + a * sin;
  }
}

/**
 * RMSNorm: x / sqrt(mean(x²) + eps) · w.
 * @param x (n) input
 * @param w (n) weight
 * @param eps rms_norm_eps
 * @returns (n) a new array
 */
export function rmsNorm(x: Float64Array, w: Float64Array, eps: number): Float64Array {
  let sumSq = 0;
  for (let i = 0; i < x.length; i++) sumSq += x[i] * x[i];
  const scale = 1 / Math.sqrt(sumSq / x.length + eps);
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i] * scale * w[i];
  return out;
}

/** y = W·x (+ b): W (rows, cols) row-major, x (cols) → y (rows). */
export function linear(w: Tensor64, x: Float64Array, bias?: Tensor64): Float64Array {
  const [rows, cols] = w.shape;
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    const base = r * cols;
    for (let c = 0; c < cols; c++) s += w.data[base + c] * x[c];
    y[r] = bias ? s + bias.data[r] : s;
  }
  return y;
}

/** SiLU: x · sigmoid(x). */
export function silu(x: number): number {
  return x / (1 + Math.exp(-x));
}

/**
 * Full forward pass over tokens at positions 0..n-1 (causal attention, no cache).
 * @param model config + float64 weights
 * @param tokens (n) token ids, each < vocab
 * @returns (n, vocab) row-major logits for every position
 * @throws RangeError on a token id outside [0, vocab) or beyond a sliding window
 */
export function referenceForward(model: RefModel, tokens: ArrayLike<number>): Float64Array {
  const c = model.config;
  const n = tokens.length;
  const { hiddenSize: hidden, headDim: d, numHeads, numKvHeads, vocabSize: vocab } = c;
  if (c.slidingWindow !== null && n > c.slidingWindow) {
    throw new RangeError(`reference: ${n} tokens exceed sliding_window ${c.slidingWindow}`);
  }
  const W = (name: string): Tensor64 => {
    const t = model.weights.get(name);
    if (!t) throw new Error(`reference: missing weight ${name}`);
    return t;
  };
  const Wopt = (name: string, present: boolean): Tensor64 | undefined =>
    present ? W(name) : undefined;
  const invFreq = ropeInvFreq(d, c.ropeTheta, c.ropeScaling);
  const groupSize = numHeads / numKvHeads; // query heads per kv head (transformers repeat_kv)

  // Residual stream: n vectors of (hidden).
  const embed = W("model.embed_tokens.weight");
  const h: Float64Array[] = [];
  for (let t = 0; t < n; t++) {
    const id = tokens[t];
    if (!Number.isInteger(id) || id < 0 || id >= vocab) {
      throw new RangeError(`reference: token id ${id} at ${t} outside [0, ${vocab})`);
    }
    h.push(embed.data.slice(id * hidden, (id + 1) * hidden));
  }

  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`;
    // Attention block. q[t][head]: (head_dim); k[t][kvHead], v[t][kvHead]: (head_dim).
    const q: Float64Array[][] = [], k: Float64Array[][] = [], v: Float64Array[][] = [];
    for (let t = 0; t < n; t++) {
      const x = rmsNorm(h[t], W(p + "input_layernorm.weight").data, c.rmsNormEps);
      const qAll = linear(
        W(p + "self_attn.q_proj.weight"),
        x,
        Wopt(p + "self_attn.q_proj.bias", c.qkvBias),
      );
      const kAll = linear(
        W(p + "self_attn.k_proj.weight"),
        x,
        Wopt(p + "self_attn.k_proj.bias", c.qkvBias),
      );
      const vAll = linear(
        W(p + "self_attn.v_proj.weight"),
        x,
        Wopt(p + "self_attn.v_proj.bias", c.qkvBias),
      );
      const qHeads: Float64Array[] = [], kHeads: Float64Array[] = [], vHeads: Float64Array[] = [];
      for (let hh = 0; hh < numHeads; hh++) {
        let qh: Float64Array = qAll.slice(hh * d, (hh + 1) * d);
        if (c.qkNorm) qh = rmsNorm(qh, W(p + "self_attn.q_norm.weight").data, c.rmsNormEps);
        applyRope(qh, t, invFreq);
        qHeads.push(qh);
      }
      for (let g = 0; g < numKvHeads; g++) {
        let kh: Float64Array = kAll.slice(g * d, (g + 1) * d);
        if (c.qkNorm) kh = rmsNorm(kh, W(p + "self_attn.k_norm.weight").data, c.rmsNormEps);
        applyRope(kh, t, invFreq);
        kHeads.push(kh);
        vHeads.push(vAll.slice(g * d, (g + 1) * d));
      }
      q.push(qHeads);
      k.push(kHeads);
      v.push(vHeads);
    }
    for (let t = 0; t < n; t++) {
      const attnOut = new Float64Array(numHeads * d); // concatenated heads
      for (let hh = 0; hh < numHeads; hh++) {
        const g = Math.floor(hh / groupSize);
        // scores over s = 0..t (causal), scaled by 1/sqrt(head_dim), softmax.
        const scores = new Float64Array(t + 1);
        let max = -Infinity;
        for (let s = 0; s <= t; s++) {
          let dot = 0;
          for (let i = 0; i < d; i++) dot += q[t][hh][i] * k[s][g][i];
          scores[s] = dot / Math.sqrt(d);
          if (scores[s] > max) max = scores[s];
        }
        let sum = 0;
        for (let s = 0; s <= t; s++) {
          scores[s] = Math.exp(scores[s] - max);
          sum += scores[s];
        }
        for (let s = 0; s <= t; s++) {
          const pr = scores[s] / sum;
          for (let i = 0; i < d; i++) attnOut[hh * d + i] += pr * v[s][g][i];
        }
      }
      const o = linear(
        W(p + "self_attn.o_proj.weight"),
        attnOut,
        Wopt(p + "self_attn.o_proj.bias", c.oBias),
      );
      for (let i = 0; i < hidden; i++) h[t][i] += o[i];
    }
    // MLP block: down(silu(gate(x)) · up(x)).
    for (let t = 0; t < n; t++) {
      const x = rmsNorm(h[t], W(p + "post_attention_layernorm.weight").data, c.rmsNormEps);
      const gate = linear(
        W(p + "mlp.gate_proj.weight"),
        x,
        Wopt(p + "mlp.gate_proj.bias", c.mlpBias),
      );
      const up = linear(W(p + "mlp.up_proj.weight"), x, Wopt(p + "mlp.up_proj.bias", c.mlpBias));
      const act = new Float64Array(gate.length);
      for (let i = 0; i < act.length; i++) act[i] = silu(gate[i]) * up[i];
      const down = linear(
        W(p + "mlp.down_proj.weight"),
        act,
        Wopt(p + "mlp.down_proj.bias", c.mlpBias),
      );
      for (let i = 0; i < hidden; i++) h[t][i] += down[i];
    }
  }

  const head = c.tieWordEmbeddings ? embed : W("lm_head.weight");
  const logits = new Float64Array(n * vocab);
  for (let t = 0; t < n; t++) {
    const x = rmsNorm(h[t], W("model.norm.weight").data, c.rmsNormEps);
    logits.set(linear(head, x), t * vocab);
  }
  return logits;
}

/**
 * Mean next-token negative log-likelihood (nats) of tokens 1..n-1 given the tokens before them.
 * @param logits (n, vocab) from referenceForward
 * @param tokens (n) the same token ids
 * @param vocab vocabulary size
 * @returns mean NLL over n-1 predictions
 */
export function meanNll(logits: Float64Array, tokens: ArrayLike<number>, vocab: number): number {
  let total = 0;
  for (let t = 0; t + 1 < tokens.length; t++) {
    let max = -Infinity;
    for (let j = 0; j < vocab; j++) max = Math.max(max, logits[t * vocab + j]);
    let sum = 0;
    for (let j = 0; j < vocab; j++) sum += Math.exp(logits[t * vocab + j] - max);
    total += Math.log(sum) + max - logits[t * vocab + tokens[t + 1]];
  }
  return total / (tokens.length - 1);
}
