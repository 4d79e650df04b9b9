// Projector artifacts on disk: `projector.json` (zod schema below: kind, pair names and
// fingerprints, geometries, layer map, λ, repair default, temperature, calibration, measured
// quality) and `weights.safetensors` (linear kind: per target layer K/V maps in feature space)
// or an ONNX file (onnx kind). Reads validate everything against each other; no model is loaded.

import { z } from "zod";
import type { ModelConfig } from "../model/mod.ts";
import { encodeSafetensors, readSafetensorsHeader, readTensorBytes } from "../model/mod.ts";
import type { TensorInfo } from "../model/mod.ts";
import { ProjectorFormatError } from "./errors.ts";

const hex64 = z.string().regex(/^[0-9a-f]{64}$/, "must be 64 lowercase hex digits");
const posInt = z.number().int().min(1).max(65536);
const finite = z.number().refine(Number.isFinite, "must be finite");

const ropeScalingSchema = z.union([
  z.null(),
  z.object({ type: z.literal("linear"), factor: finite }).strict(),
  z.object({
    type: z.literal("llama3"),
    factor: finite,
    lowFreqFactor: finite,
    highFreqFactor: finite,
    originalMaxPosition: z.number().int(),
  }).strict(),
]);

/** One side of the pair: model name, fingerprint and the KV geometry the projector assumes. */
export const modelRefSchema = z.object({
  name: z.string().min(1).max(200),
  fingerprint: hex64,
  architecture: z.string().min(1),
  layers: posInt,
  kv_heads: posInt,
  head_dim: posInt.refine((d) => d % 2 === 0, "head_dim must be even"),
  rope_theta: finite.refine((t) => t > 1, "rope_theta must be > 1"),
  rope_scaling: ropeScalingSchema,
  qk_norm: z.boolean(),
}).strict();
export type ModelRef = z.infer<typeof modelRefSchema>;

const layerMapEntry = z.object({
  target_layer: z.number().int().min(0),
  k_source_layers: z.array(z.number().int().min(0)).min(1),
  v_source_layers: z.array(z.number().int().min(0)).min(1),
  k_lambda: finite.refine((x) => x >= 0, "lambda >= 0"),
  v_lambda: finite.refine((x) => x >= 0, "lambda >= 0"),
  k_heldout_r2: finite.nullable(),
  v_heldout_r2: finite.nullable(),
}).strict();
export type LayerMapEntry = z.infer<typeof layerMapEntry>;

const rate = z.number().refine(Number.isFinite, "must be finite");
/** Metrics of one repair length r (see evaluate.ts for definitions). */
export const repairMetricsSchema = z.looseObject({
  nll: rate,
  recovered: rate,
  kl: rate,
  kl_recovered: rate,
  top1_agreement: rate,
  ttft_ms: rate,
});
export type RepairMetrics = z.infer<typeof repairMetricsSchema>;

/** The eval-migration JSON (plus the settings it ran with), as stored in projector.json. */
export const qualitySchema = z.looseObject({
  file: z.string(),
  prefix: posInt,
  continuation: posInt,
  windows: z.number().int().min(1),
  full_nll: rate,
  no_prefix_nll: rate,
  source_nll: rate,
  no_prefix_kl: rate,
  no_prefix_top1_agreement: rate,
  full_ttft_ms: rate,
  repair: z.record(z.string().regex(/^[1-9][0-9]*$/), repairMetricsSchema),
});
export type Quality = z.infer<typeof qualitySchema>;

/** projector.json. */
export const projectorMetaSchema = z.object({
  format: z.literal("kvrelay-projector"),
  version: z.literal(1),
  kind: z.enum(["linear", "onnx"]),
  source: modelRefSchema,
  target: modelRefSchema,
  tokenizer_fingerprint: hex64,
  features: z.object({
    layout: z.string(),
    source_width: posInt,
    target_width: posInt,
  }).strict(),
  layer_map: z.array(layerMapEntry).nullable(),
  lambda: z.object({
    mode: z.enum(["auto", "fixed", "none"]),
    grid: z.array(finite),
    scale: z.string(),
  }).strict().nullable(),
  source_layer_selection: z.union([z.enum(["auto", "all"]), posInt]).nullable(),
  repair_default: posInt,
  temperature: finite.refine((t) => t > 0, "temperature must be > 0").nullable(),
  calibration: z.looseObject({
    corpus: z.array(z.string()),
    tokens: z.number().int().min(0),
  }),
  quality: qualitySchema.nullable(),
  onnx: z.object({
    file: z.string().regex(/^[A-Za-z0-9._-]+\.onnx$/, "a plain file name ending in .onnx"),
    inputs: z.object({ k: z.string().min(1), v: z.string().min(1) }).strict(),
    outputs: z.object({ k: z.string().min(1), v: z.string().min(1) }).strict(),
  }).strict().optional(),
  attribution: z.string().optional(),
}).strict().superRefine((m, ctx) => {
  const sw = m.source.layers * m.source.kv_heads * m.source.head_dim;
  const tw = m.target.layers * m.target.kv_heads * m.target.head_dim;
  if (m.features.source_width !== sw) {
    ctx.addIssue({
      code: "custom",
      path: ["features", "source_width"],
      message: `is ${m.features.source_width}, source geometry gives ${sw}`,
    });
  }
  if (m.features.target_width !== tw) {
    ctx.addIssue({
      code: "custom",
      path: ["features", "target_width"],
      message: `is ${m.features.target_width}, target geometry gives ${tw}`,
    });
  }
  if (m.kind === "onnx" && m.onnx === undefined) {
    ctx.addIssue({ code: "custom", path: ["onnx"], message: "kind onnx needs an onnx section" });
  }
  if (m.kind === "linear") {
    if (m.layer_map === null) {
      ctx.addIssue({
        code: "custom",
        path: ["layer_map"],
        message: "kind linear needs a layer map",
      });
      return;
    }
    if (m.layer_map.length !== m.target.layers) {
      ctx.addIssue({
        code: "custom",
        path: ["layer_map"],
        message: `has ${m.layer_map.length} entries, target has ${m.target.layers} layers`,
      });
    }
    m.layer_map.forEach((e, i) => {
      if (e.target_layer !== i) {
        ctx.addIssue({
          code: "custom",
          path: ["layer_map", i, "target_layer"],
          message: `is ${e.target_layer}, expected ${i}`,
        });
      }
      for (const key of ["k_source_layers", "v_source_layers"] as const) {
        const ls = e[key];
        ls.forEach((l, j) => {
          if (l >= m.source.layers || (j > 0 && l <= ls[j - 1])) {
            ctx.addIssue({
              code: "custom",
              path: ["layer_map", i, key, j],
              message: `${l} is not an increasing source layer index < ${m.source.layers}`,
            });
          }
        });
      }
    });
  }
});
export type ProjectorMeta = z.infer<typeof projectorMetaSchema>;

/**
 * Validates a parsed projector.json.
 * @param json parsed JSON
 * @param path file path for messages
 * @returns the metadata
 * @throws ProjectorFormatError quoting every issue
 */
export function parseProjectorMeta(json: unknown, path?: string): ProjectorMeta {
  const r = projectorMetaSchema.safeParse(json);
  if (!r.success) {
    const issues = r.error.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`);
    throw new ProjectorFormatError(`invalid projector.json: ${issues.join("; ")}`, path);
  }
  return r.data;
}

/**
 * The geometry record of a model config, as stored in projector.json.
 * @param name model name (directory base name)
 * @param fingerprint model fingerprint (lib/model)
 * @param c its config
 * @returns the model reference
 */
export function modelRef(name: string, fingerprint: string, c: ModelConfig): ModelRef {
  return {
    name,
    fingerprint,
    architecture: c.architecture,
    layers: c.numLayers,
    kv_heads: c.numKvHeads,
    head_dim: c.headDim,
    rope_theta: c.ropeTheta,
    rope_scaling: c.ropeScaling,
    qk_norm: c.family === "qwen3",
  };
}

/**
 * Differences between a stored geometry and a model config ("" when they agree).
 * @param ref stored reference
 * @param c the model's config
 * @returns a description of the first mismatch, or ""
 */
export function geometryMismatch(ref: ModelRef, c: ModelConfig): string {
  const now = modelRef(ref.name, ref.fingerprint, c);
  for (const key of ["layers", "kv_heads", "head_dim", "rope_theta", "qk_norm"] as const) {
    if (ref[key] !== now[key]) return `${key} is ${now[key]}, projector expects ${ref[key]}`;
  }
  if (JSON.stringify(ref.rope_scaling) !== JSON.stringify(now.rope_scaling)) {
    return `rope_scaling is ${JSON.stringify(now.rope_scaling)}, projector expects ${
      JSON.stringify(ref.rope_scaling)
    }`;
  }
  return "";
}

/** Per target layer linear maps in feature space (selected source layers only). */
export interface LayerWeights {
  /** (tgt kv_heads·head_dim, |k_source_layers|·src kv_heads·head_dim) */
  kWeight: Float32Array;
  kBias: Float32Array;
  /** (tgt kv_heads·head_dim, |v_source_layers|·src kv_heads·head_dim) */
  vWeight: Float32Array;
  vBias: Float32Array;
}

function tensorNames(t: number) {
  return {
    kWeight: `layers.${t}.k.weight`,
    kBias: `layers.${t}.k.bias`,
    vWeight: `layers.${t}.v.weight`,
    vBias: `layers.${t}.v.bias`,
  } as const;
}

function expectedShapes(meta: ProjectorMeta, e: LayerMapEntry) {
  const out = meta.target.kv_heads * meta.target.head_dim;
  const per = meta.source.kv_heads * meta.source.head_dim;
  return {
    kWeight: [out, e.k_source_layers.length * per],
    kBias: [out],
    vWeight: [out, e.v_source_layers.length * per],
    vBias: [out],
  } as const;
}

/**
 * Reads and validates a projector directory's projector.json.
 * @param dir the projector directory
 * @returns the metadata
 * @throws ProjectorFormatError when missing or invalid
 */
export async function readProjectorMeta(dir: string): Promise<ProjectorMeta> {
  const path = `${dir}/projector.json`;
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    throw new ProjectorFormatError(`cannot read: ${(e as Error).message}`, path);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new ProjectorFormatError(`not JSON: ${(e as Error).message}`, path);
  }
  return parseProjectorMeta(json, path);
}

/**
 * Reads weights.safetensors of a linear projector, checking names, dtype (F32) and shapes
 * against the layer map; extra tensors are an error.
 * @param dir the projector directory
 * @param meta its metadata (kind linear)
 * @returns one LayerWeights per target layer
 * @throws ProjectorFormatError on any inconsistency
 */
export async function readLinearWeights(dir: string, meta: ProjectorMeta): Promise<LayerWeights[]> {
  const path = `${dir}/weights.safetensors`;
  if (meta.kind !== "linear" || meta.layer_map === null) {
    throw new ProjectorFormatError(`kind ${meta.kind} has no linear weights`, path);
  }
  let tensors: TensorInfo[];
  try {
    tensors = (await readSafetensorsHeader(path)).tensors;
  } catch (e) {
    throw new ProjectorFormatError((e as Error).message, path);
  }
  const byName = new Map(tensors.map((t) => [t.name, t]));
  const seen = new Set<string>();
  const out: LayerWeights[] = [];
  for (const e of meta.layer_map) {
    const names = tensorNames(e.target_layer);
    const shapes = expectedShapes(meta, e);
    const layer: Partial<LayerWeights> = {};
    for (const key of ["kWeight", "kBias", "vWeight", "vBias"] as const) {
      const info = byName.get(names[key]);
      if (info === undefined) {
        throw new ProjectorFormatError(`missing tensor ${JSON.stringify(names[key])}`, path);
      }
      seen.add(info.name);
      if (info.dtype !== "F32") {
        throw new ProjectorFormatError(`tensor ${info.name} is ${info.dtype}, expected F32`, path);
      }
      if (JSON.stringify(info.shape) !== JSON.stringify(shapes[key])) {
        throw new ProjectorFormatError(
          `tensor ${info.name} has shape ${JSON.stringify(info.shape)}, layer map implies ${
            JSON.stringify(shapes[key])
          }`,
          path,
        );
      }
      const bytes = await readTensorBytes(info);
      const f = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4).slice();
      if (!f.every(Number.isFinite)) {
        throw new ProjectorFormatError(`tensor ${info.name} holds non-finite values`, path);
      }
      layer[key] = f;
    }
    out.push(layer as LayerWeights);
  }
  const extra = tensors.filter((t) => !seen.has(t.name)).map((t) => t.name);
  if (extra.length > 0) {
    throw new ProjectorFormatError(`unexpected tensors ${JSON.stringify(extra.slice(0, 5))}`, path);
  }
  return out;
}

/**
 * Expands per-layer maps into dense feature-space matrices for the native kernel: zeros for
 * unselected source layers.
 * @param meta linear projector metadata
 * @param layers its weights
 * @returns wk, wv (target_width, source_width) and bk, bv (target_width), f32
 */
export function denseWeights(meta: ProjectorMeta, layers: LayerWeights[]) {
  const ns = meta.features.source_width, nt = meta.features.target_width;
  const per = meta.source.kv_heads * meta.source.head_dim;
  const out = meta.target.kv_heads * meta.target.head_dim;
  const wk = new Float32Array(nt * ns), wv = new Float32Array(nt * ns);
  const bk = new Float32Array(nt), bv = new Float32Array(nt);
  meta.layer_map!.forEach((e, t) => {
    const lw = layers[t];
    for (
      const [w, b, srcLayers, lwW, lwB] of [
        [wk, bk, e.k_source_layers, lw.kWeight, lw.kBias],
        [wv, bv, e.v_source_layers, lw.vWeight, lw.vBias],
      ] as const
    ) {
      const nSel = srcLayers.length * per;
      for (let o = 0; o < out; o++) {
        const row = (t * out + o) * ns;
        srcLayers.forEach((sl, j) => {
          w.set(lwW.subarray(o * nSel + j * per, o * nSel + (j + 1) * per), row + sl * per);
        });
        b[t * out + o] = lwB[o];
      }
    }
  });
  return { wk, bk, wv, bv };
}

/**
 * Writes a projector directory: projector.json (pretty, validated first) and, for the linear
 * kind, weights.safetensors.
 * @param dir output directory (created)
 * @param meta metadata
 * @param layers linear weights (one per target layer), omitted for onnx
 * @throws ProjectorFormatError when meta is invalid or weights do not match it
 */
export async function writeProjector(
  dir: string,
  meta: ProjectorMeta,
  layers?: LayerWeights[],
): Promise<void> {
  parseProjectorMeta(meta, `${dir}/projector.json`);
  await Deno.mkdir(dir, { recursive: true });
  if (meta.kind === "linear") {
    if (layers === undefined || layers.length !== meta.target.layers) {
      throw new ProjectorFormatError(
        `need ${meta.target.layers} layer weights, got ${layers?.length}`,
        dir,
      );
    }
    const entries = meta.layer_map!.flatMap((e, t) => {
      const names = tensorNames(t), shapes = expectedShapes(meta, e);
      return (["kWeight", "kBias", "vWeight", "vBias"] as const).map((key) => ({
        name: names[key],
        dtype: "F32" as const,
        shape: [...shapes[key]],
        data: new Uint8Array(
          layers[t][key].buffer,
          layers[t][key].byteOffset,
          layers[t][key].byteLength,
        ),
      }));
    });
    await Deno.writeFile(
      `${dir}/weights.safetensors`,
      encodeSafetensors(entries, { format: "kvrelay-projector" }),
    );
  }
  await Deno.writeTextFile(`${dir}/projector.json`, JSON.stringify(meta, null, 2) + "\n");
}
