// Checks a deployment config against the files it names before a server listens: every tier's
// model folder (config.json, weights, tokenizer.json), its paged KV pool (kv_pool_mb derived from
// the model's geometry when absent; one too small for a max_context sequence refused with the size
// that works) and each projector's pair (artifact readable, geometry of the tiers it joins).
// Reads only small JSON files and directory entries; loading is runtime.ts.

import type { KvrelayConfig, TierConfig } from "../config/mod.ts";
import { type ModelConfig, readModelConfig } from "../model/mod.ts";
import { geometryMismatch, readProjectorMeta } from "../migrate/mod.ts";

/** The part of a model's geometry its KV cache size follows. */
export type KvGeometry = Pick<ModelConfig, "numLayers" | "numKvHeads" | "headDim">;

const MIB = 2 ** 20;

/**
 * Bytes of one KV pool block: every layer's K and V for `blockTokens` positions.
 * @param g the model's geometry
 * @param kvDtype the cache element type
 * @param blockTokens positions per block
 * @returns bytes
 */
export function kvBlockBytes(g: KvGeometry, kvDtype: TierConfig["kv_dtype"], blockTokens: number) {
  const elem = kvDtype === "f32" ? 4 : 2;
  return 2 * g.numLayers * g.numKvHeads * g.headDim * elem * blockTokens;
}

/**
 * The smallest kv_pool_mb (whole MiB) whose pool holds one max_context sequence.
 * @param g the model's geometry
 * @param tc the tier config
 * @returns MiB
 */
export function minKvPoolMb(g: KvGeometry, tc: TierConfig): number {
  const blocks = Math.ceil(tc.max_context / tc.kv_block_tokens);
  return Math.ceil((blocks * kvBlockBytes(g, tc.kv_dtype, tc.kv_block_tokens)) / MIB);
}

/**
 * kv_pool_mb when the config gives none: `concurrency` sequences of max_context tokens, so every
 * admitted generation can reach max_context without a preemption (the pool's memory is touched
 * only as sequences grow).
 * @param g the model's geometry
 * @param tc the tier config
 * @returns MiB (whole)
 */
export function derivedKvPoolMb(g: KvGeometry, tc: TierConfig): number {
  const blocks = tc.concurrency * Math.ceil(tc.max_context / tc.kv_block_tokens);
  return Math.ceil((blocks * kvBlockBytes(g, tc.kv_dtype, tc.kv_block_tokens)) / MIB);
}

async function exists(path: string): Promise<boolean> {
  return await Deno.stat(path).then(() => true, () => false);
}

async function modelProblems(
  field: string,
  dir: string,
): Promise<{ problems: string[]; config?: ModelConfig }> {
  const isDir = await Deno.stat(dir).then((s) => s.isDirectory, () => null);
  if (isDir === null) {
    return {
      problems: [
        `${field}: "${dir}" does not exist (a Hugging Face checkpoint folder: config.json, ` +
        `model.safetensors, tokenizer.json; relative paths resolve against the config file's folder)`,
      ],
    };
  }
  if (!isDir) return { problems: [`${field}: "${dir}" is a file, not a checkpoint folder`] };
  let config: ModelConfig;
  try {
    config = await readModelConfig(dir);
  } catch (e) {
    return { problems: [`${field}: "${dir}": ${(e as Error).message}`] };
  }
  const problems: string[] = [];
  if (
    !(await exists(`${dir}/model.safetensors`)) &&
    !(await exists(`${dir}/model.safetensors.index.json`))
  ) {
    problems.push(
      `${field}: "${dir}" has no weights (neither model.safetensors nor model.safetensors.index.json)`,
    );
  }
  if (!(await exists(`${dir}/tokenizer.json`))) {
    problems.push(`${field}: "${dir}" has no tokenizer.json`);
  }
  return { problems, config };
}

/**
 * Checks every tier's model folder and KV pool and every projector's pair; fills in each
 * batching tier's derived kv_pool_mb when the file gives none.
 * @param config the ready config (paths absolute); tiers' kv_pool_mb may be set here
 * @returns one "path: message" line per problem (empty when all is well)
 */
export async function preflightProblems(config: KvrelayConfig): Promise<string[]> {
  const problems: string[] = [];
  const geometry = new Map<string, ModelConfig>();
  for (const name of config.tierOrder) {
    const tc = config.tiers[name];
    const r = await modelProblems(`tiers.${name}.model`, tc.model);
    problems.push(...r.problems);
    if (!r.config) continue;
    geometry.set(name, r.config);
    if (!tc.batching) continue;
    const min = minKvPoolMb(r.config, tc);
    if (tc.kv_pool_mb === undefined) tc.kv_pool_mb = derivedKvPoolMb(r.config, tc);
    else if (tc.kv_pool_mb < min) {
      const per = kvBlockBytes(r.config, tc.kv_dtype, tc.kv_block_tokens);
      const blocks = Math.floor((tc.kv_pool_mb * MIB) / per);
      problems.push(
        `tiers.${name}.kv_pool_mb: ${tc.kv_pool_mb} holds ${blocks} blocks of ` +
          `${tc.kv_block_tokens} tokens, fewer than one max_context (${tc.max_context}) sequence ` +
          `needs (${Math.ceil(tc.max_context / tc.kv_block_tokens)}): set it to at least ${min}, ` +
          `or leave it out (derived: ${derivedKvPoolMb(r.config, tc)} for concurrency ` +
          `${tc.concurrency}), or lower max_context`,
      );
    }
  }
  for (const [i, p] of config.projectors.entries()) {
    let meta;
    try {
      meta = await readProjectorMeta(p.path);
    } catch (e) {
      problems.push(`projectors.${i}.path: "${p.path}": ${(e as Error).message.split("\n")[0]}`);
      continue;
    }
    for (
      const [end, tier, ref] of [["from", p.from, meta.source], ["to", p.to, meta.target]] as const
    ) {
      const g = geometry.get(tier);
      if (!g) continue;
      const diff = geometryMismatch(ref, g);
      if (diff !== "") {
        problems.push(
          `projectors.${i}.${end}: tier "${tier}" cannot be this projector's ${
            end === "from" ? "source" : "target"
          } (${ref.name}): its model's ${diff}`,
        );
      }
    }
  }
  return problems;
}
