// Test-only helpers for lib/model and lib/native tests: temp dirs, a random tiny checkpoint
// writer and a demo-checkpoint resharder. Not imported by production code.

import {
  encodeSafetensors,
  readSafetensorsHeader,
  readTensorBytes,
  type SafetensorsEntry,
} from "./safetensors.ts";

/** Repository root (absolute path, trailing slash). */
export const REPO = new URL("../../", import.meta.url).pathname;
/** Demo model directories. */
export const DEMO_MODELS = ["tiny-fast", "tiny-balanced", "tiny-powerful"].map((m) =>
  `${REPO}models/${m}`
);

/** Creates a temp dir; returns its path. */
export async function tempDir(prefix = "kvr-model-test-"): Promise<string> {
  return await Deno.makeTempDir({ prefix });
}

/** Copies the JSON side files (config, generation config) of a checkpoint dir. */
export async function copyJsonFiles(from: string, to: string): Promise<void> {
  for (const f of ["config.json", "generation_config.json"]) {
    await Deno.copyFile(`${from}/${f}`, `${to}/${f}`);
  }
}

/** Reads every tensor of a single-file checkpoint as encoder entries (file order). */
export async function readAllEntries(file: string): Promise<SafetensorsEntry[]> {
  const { tensors } = await readSafetensorsHeader(file);
  const out: SafetensorsEntry[] = [];
  for (const t of tensors) {
    out.push({ name: t.name, dtype: t.dtype, shape: t.shape, data: await readTensorBytes(t) });
  }
  return out;
}

/**
 * Writes `src` (a single-file checkpoint) into `dst` as two shards plus an index; the split puts
 * alternate tensors into each shard so both shards span all layers.
 */
export async function writeShardedCopy(src: string, dst: string): Promise<void> {
  await copyJsonFiles(src, dst);
  const entries = await readAllEntries(`${src}/model.safetensors`);
  const shards: SafetensorsEntry[][] = [[], []];
  entries.forEach((e, i) => shards[i % 2].push(e));
  const names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
  const weightMap: Record<string, string> = {};
  for (let s = 0; s < 2; s++) {
    await Deno.writeFile(`${dst}/${names[s]}`, encodeSafetensors(shards[s], { format: "pt" }));
    for (const e of shards[s]) weightMap[e.name] = names[s];
  }
  await Deno.writeTextFile(
    `${dst}/model.safetensors.index.json`,
    JSON.stringify({ metadata: { total_size: 0 }, weight_map: weightMap }),
  );
}

/** Builds a little-endian u64 header-length prefix followed by `header` (string or bytes). */
export function rawSafetensors(
  headerLength: bigint,
  header: string | Uint8Array,
  data = new Uint8Array(0),
): Uint8Array {
  const h = typeof header === "string" ? new TextEncoder().encode(header) : header;
  const out = new Uint8Array(8 + h.length + data.length);
  new DataView(out.buffer).setBigUint64(0, headerLength, true);
  out.set(h, 8);
  out.set(data, 8 + h.length);
  return out;
}
