// Tests for loadCheckpoint: demo checkpoints, a sharded copy written by the test (same tensors and
// fingerprint as the single file), generation_config eos merging, and broken directories/indexes.

import assert from "node:assert/strict";
import { loadCheckpoint } from "./checkpoint.ts";
import { ModelFormatError } from "./errors.ts";
import { encodeSafetensors } from "./safetensors.ts";
import {
  copyJsonFiles,
  DEMO_MODELS,
  readAllEntries,
  tempDir,
  writeShardedCopy,
} from "./test_helpers.ts";

const FAST = DEMO_MODELS[0];

async function rejects(dir: string, pattern: RegExp): Promise<void> {
  await assert.rejects(loadCheckpoint(dir), (e: unknown) => {
    assert.ok(e instanceof ModelFormatError, `expected ModelFormatError, got ${e}`);
    assert.match(e.message, pattern);
    return true;
  });
}

Deno.test("`loadCheckpoint()` loads each demo checkpoint with all tensors in one file", async () => {
  const expected: Record<string, number> = {
    "tiny-fast": 46,
    "tiny-balanced": 56,
    "tiny-powerful": 90,
  };
  for (const dir of DEMO_MODELS) {
    const c = await loadCheckpoint(dir);
    const name = dir.split("/").pop()!;
    assert.equal(c.tensors.size, expected[name]);
    assert.deepEqual(c.files, [`${c.dir}/model.safetensors`]);
    assert.match(c.fingerprint, /^[0-9a-f]{64}$/);
    assert.deepEqual(c.config.eosTokenIds, [4093]);
  }
});

Deno.test("`loadCheckpoint()` reads a sharded copy with the same tensors and fingerprint", async () => {
  const dir = await tempDir();
  try {
    await writeShardedCopy(FAST, dir);
    const single = await loadCheckpoint(FAST);
    const sharded = await loadCheckpoint(dir);
    assert.equal(sharded.files.length, 2);
    assert.deepEqual([...sharded.tensors.keys()].sort(), [...single.tensors.keys()].sort());
    for (const [name, t] of single.tensors) {
      const s = sharded.tensors.get(name)!;
      assert.deepEqual([s.dtype, s.shape, s.nbytes], [t.dtype, t.shape, t.nbytes]);
    }
    assert.equal(sharded.fingerprint, single.fingerprint);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("`loadCheckpoint()` refuses broken shard indexes", async () => {
  const dir = await tempDir();
  try {
    await writeShardedCopy(FAST, dir);
    const indexPath = `${dir}/model.safetensors.index.json`;
    const index = JSON.parse(await Deno.readTextFile(indexPath));
    const good = JSON.stringify(index);
    const edit = async (f: (wm: Record<string, string>) => void) => {
      const copy = JSON.parse(good);
      f(copy.weight_map);
      await Deno.writeTextFile(indexPath, JSON.stringify(copy));
    };
    await edit((wm) => (wm["model.norm.weight"] = "model-00009-of-00009.safetensors"));
    await rejects(dir, /model-00009-of-00009\.safetensors.*does not exist/);
    await edit((wm) => (wm["model.norm.weight"] = "../model.safetensors"));
    await rejects(
      dir,
      /weight_map\["model\.norm\.weight"\] = "\.\.\/model\.safetensors" is not a plain/,
    );
    await edit((wm) => (wm["model.extra.weight"] = "model-00001-of-00002.safetensors"));
    await rejects(dir, /tensor "model\.extra\.weight" listed in weight_map is missing from shard/);
    await edit((wm) => delete wm["model.norm.weight"]);
    await rejects(dir, /tensor "model\.norm\.weight" is in shard .* but weight_map says null/);
    await Deno.writeTextFile(indexPath, `{"weight_map": 3}`);
    await rejects(dir, /shard index needs "weight_map"/);
    await Deno.writeTextFile(indexPath, `{not json`);
    await rejects(dir, /cannot read shard index/);

    // the same tensor in both shards
    const entries = await readAllEntries(`${FAST}/model.safetensors`);
    const norm = entries.find((e) => e.name === "model.norm.weight")!;
    await Deno.writeTextFile(indexPath, good);
    const second = `${dir}/model-00002-of-00002.safetensors`;
    const inSecond = (await readAllEntries(second)).filter((e) => e.name !== norm.name);
    const inFirst = await readAllEntries(`${dir}/model-00001-of-00002.safetensors`);
    if (!inFirst.some((e) => e.name === norm.name)) inFirst.push(norm);
    await Deno.writeFile(`${dir}/model-00001-of-00002.safetensors`, encodeSafetensors(inFirst));
    await Deno.writeFile(second, encodeSafetensors([...inSecond, norm]));
    await rejects(dir, /tensor "model\.norm\.weight" appears in both/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("`loadCheckpoint()` merges generation_config eos ids into eosTokenIds", async () => {
  const dir = await tempDir();
  try {
    await copyJsonFiles(FAST, dir);
    await Deno.symlink(`${FAST}/model.safetensors`, `${dir}/model.safetensors`);
    await Deno.writeTextFile(
      `${dir}/generation_config.json`,
      JSON.stringify({ eos_token_id: [4095, 4093] }),
    );
    assert.deepEqual((await loadCheckpoint(dir)).config.eosTokenIds, [4093, 4095]);
    await Deno.writeTextFile(
      `${dir}/generation_config.json`,
      JSON.stringify({ eos_token_id: 5000 }),
    );
    await rejects(dir, /generation_config\.json: eos_token_id 5000 >= vocab_size 4096/);
    await Deno.remove(`${dir}/generation_config.json`);
    assert.deepEqual((await loadCheckpoint(dir)).config.eosTokenIds, [4093]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("`loadCheckpoint()` refuses missing directories, configs and weights, and mismatched tensors", async () => {
  await rejects("/nonexistent/kvr-model", /checkpoint directory not found/);
  const dir = await tempDir();
  try {
    await rejects(dir, /config\.json: cannot read/);
    await copyJsonFiles(FAST, dir);
    await rejects(dir, /neither model\.safetensors nor model\.safetensors\.index\.json exists/);
    const entries = (await readAllEntries(`${FAST}/model.safetensors`)).filter((e) =>
      e.name !== "model.layers.2.self_attn.k_norm.weight"
    );
    await Deno.writeFile(`${dir}/model.safetensors`, encodeSafetensors(entries));
    await rejects(dir, /missing tensor "model\.layers\.2\.self_attn\.k_norm\.weight"/);
    const cfg = JSON.parse(await Deno.readTextFile(`${FAST}/config.json`));
    await Deno.writeTextFile(
      `${dir}/config.json`,
      JSON.stringify({ ...cfg, intermediate_size: 256 }),
    );
    await rejects(dir, /has shape \[384,128\], expected \[256,128\]/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
