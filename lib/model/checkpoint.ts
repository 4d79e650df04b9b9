// loadCheckpoint: a Hugging Face checkpoint directory → validated Checkpoint (config, tensors by
// name with absolute file offsets, the safetensors files, fingerprint). Single-file
// (model.safetensors) or sharded (model.safetensors.index.json + shards). Reads only headers and
// the fingerprint's byte samples; never loads weights (lib/native does, by mmap).

import { z } from "zod";
import { ModelFormatError, quote } from "./errors.ts";
import {
  type GenerationSampling,
  type ModelConfig,
  readGenerationEosIds,
  readGenerationSampling,
  readModelConfig,
} from "./config.ts";
import { readSafetensorsHeader, type TensorInfo } from "./safetensors.ts";
import { mapWeights } from "./weights.ts";
import { computeFingerprint } from "./fingerprint.ts";

/** A validated checkpoint, ready for NativeModel.load. */
export interface Checkpoint {
  /** absolute directory path */
  dir: string;
  config: ModelConfig;
  /** absolute paths of the safetensors files, in shard order */
  files: string[];
  tensors: Map<string, TensorInfo>;
  /** hex SHA-256 (lib/model/fingerprint.ts) */
  fingerprint: string;
  /** Sampling defaults from generation_config.json (absent fields: none given). */
  generation?: GenerationSampling;
}

/** Options for loadCheckpoint. */
export interface LoadCheckpointOptions {
  /** fingerprint over every tensor byte instead of 4 KiB samples (slower) */
  fullHash?: boolean;
}

const SHARD_NAME = /^[A-Za-z0-9._-]+\.safetensors$/;

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw new ModelFormatError(`cannot stat: ${(e as Error).message}`, path);
  }
}

async function readShardIndex(path: string): Promise<Map<string, string>> {
  let json: unknown;
  try {
    json = JSON.parse(await Deno.readTextFile(path));
  } catch (e) {
    throw new ModelFormatError(`cannot read shard index: ${(e as Error).message}`, path);
  }
  const parsed = z.object({ weight_map: z.record(z.string(), z.string()) }).safeParse(json);
  if (!parsed.success) {
    throw new ModelFormatError(
      `shard index needs "weight_map": {tensor name: file name} (${
        parsed.error.issues[0].message
      })`,
      path,
    );
  }
  const map = new Map<string, string>();
  for (const [name, file] of Object.entries(parsed.data.weight_map)) {
    if (!SHARD_NAME.test(file) || file.startsWith(".")) {
      throw new ModelFormatError(
        `weight_map[${quote(name)}] = ${quote(file)} is not a plain *.safetensors file name`,
        path,
      );
    }
    map.set(name, file);
  }
  if (map.size === 0) throw new ModelFormatError(`weight_map is empty`, path);
  return map;
}

/**
 * Loads and validates a checkpoint directory: config.json (+ generation_config.json eos ids,
 * merged into eosTokenIds), model.safetensors or model.safetensors.index.json with its shards,
 * tensor names/shapes against the config, and the fingerprint.
 * @param dir checkpoint directory
 * @param opts fullHash for a fingerprint over all bytes
 * @returns the Checkpoint
 * @throws ModelFormatError naming the file and the problem (missing files, bad JSON, bad or
 *   hostile safetensors headers, tensors missing/duplicated/unknown/mis-shaped)
 */
export async function loadCheckpoint(
  dir: string,
  opts: LoadCheckpointOptions = {},
): Promise<Checkpoint> {
  let abs: string;
  try {
    abs = await Deno.realPath(dir);
  } catch (e) {
    throw new ModelFormatError(`checkpoint directory not found: ${(e as Error).message}`, dir);
  }
  if (!(await Deno.stat(abs)).isDirectory) {
    throw new ModelFormatError(`not a directory`, abs);
  }
  const base = await readModelConfig(abs);
  const genEos = await readGenerationEosIds(abs, base.vocabSize);
  const generation = await readGenerationSampling(abs);
  const config: ModelConfig = {
    ...base,
    eosTokenIds: [...new Set([...base.eosTokenIds, ...genEos])],
  };

  const indexPath = `${abs}/model.safetensors.index.json`;
  const singlePath = `${abs}/model.safetensors`;
  const tensors = new Map<string, TensorInfo>();
  let files: string[];
  if (await exists(indexPath)) {
    const weightMap = await readShardIndex(indexPath);
    const shardNames = [...new Set(weightMap.values())].sort();
    files = shardNames.map((n) => `${abs}/${n}`);
    for (const file of files) {
      if (!(await exists(file))) {
        throw new ModelFormatError(
          `shard ${quote(file)} listed in weight_map does not exist`,
          indexPath,
        );
      }
    }
    for (const file of files) {
      const { tensors: inShard } = await readSafetensorsHeader(file);
      for (const t of inShard) {
        const prev = tensors.get(t.name);
        if (prev) {
          throw new ModelFormatError(
            `tensor ${quote(t.name)} appears in both ${quote(prev.file)} and ${quote(file)}`,
            indexPath,
          );
        }
        tensors.set(t.name, t);
      }
    }
    for (const t of tensors.values()) {
      const shardName = t.file.slice(abs.length + 1);
      const listed = weightMap.get(t.name);
      if (listed !== shardName) {
        throw new ModelFormatError(
          `tensor ${quote(t.name)} is in shard ${quote(shardName)} but weight_map says ${
            quote(listed ?? null)
          }`,
          indexPath,
        );
      }
    }
    for (const [name, file] of weightMap) {
      if (!tensors.has(name)) {
        throw new ModelFormatError(
          `tensor ${quote(name)} listed in weight_map is missing from shard ${quote(file)}`,
          indexPath,
        );
      }
    }
  } else if (await exists(singlePath)) {
    files = [singlePath];
    for (const t of (await readSafetensorsHeader(singlePath)).tensors) tensors.set(t.name, t);
  } else {
    throw new ModelFormatError(
      `no weights: neither model.safetensors nor model.safetensors.index.json exists`,
      abs,
    );
  }

  mapWeights(config, tensors, abs);
  const fingerprint = await computeFingerprint(config, tensors.values(), opts);
  return { dir: abs, config, files, tensors, fingerprint, generation };
}
