// Migration on generated checkpoints: same-model migration is a bit-exact copy; a projector fitted
// from a model onto itself is ≈ identity (KV reproduced, gap recovered ≈ 1); refusals for a
// different tokenizer and for projectors of another pair; repair r decoding matches full prefill.

import assert from "node:assert/strict";
import { type LoadedModel, loadModel } from "../engine/mod.ts";
import { writeRandomCheckpoint } from "../../tests/fixtures/random_checkpoint.ts";
import { denseWeights } from "./artifact.ts";
import { MigrationRefusedError } from "./errors.ts";
import { evaluateMigration } from "./evaluate.ts";
import { fitLinearProjector } from "./fit.ts";
import { endpointOf, migrateAndRepair, migrateKv } from "./migrate.ts";
import { LinearKernel, readCacheBlock } from "./native.ts";
import type { Projector } from "./projector.ts";
import { argmaxOf } from "./temperature.ts";

const text = await Deno.readTextFile(new URL("../../models/README.md", import.meta.url));

async function makeModel(seed: number): Promise<{ model: LoadedModel; dir: string }> {
  const dir = await Deno.makeTempDir({ prefix: "kvr-migrate-" });
  await writeRandomCheckpoint(dir, {
    name: "mig",
    architecture: "Qwen3ForCausalLM",
    vocab: 4096,
    hidden: 64,
    intermediate: 96,
    layers: 2,
    heads: 4,
    kvHeads: 2,
    headDim: 16,
    dtype: "F32",
    tie: true,
    seed,
  });
  return { model: await loadModel(dir, { threads: 2 }), dir };
}

/** The same weights under another fingerprint: forces the projection path. */
function alias(m: LoadedModel): LoadedModel {
  return { ...m, name: `${m.name}-alias`, fingerprint: "f".repeat(64) };
}

Deno.test("migrateKv() copies KV bit-exactly and repair decoding equals full prefill when both sides are the same model", async () => {
  const { model, dir } = await makeModel(21);
  try {
    const ids = model.tokenizer.encode(text).slice(0, 40);
    using src = model.native.createSequence(64);
    await src.prefill(ids);
    using dst = model.native.createSequence(64);
    const r = await migrateAndRepair({
      source: endpointOf(model),
      sourceSeq: src,
      target: endpointOf(model),
      targetSeq: dst,
      projector: null,
      prompt: ids,
      repair: 3,
    });
    assert.equal(r.mode, "copy");
    assert.equal(r.migratedTokens, 37);
    assert.equal(dst.length, 40);
    for (let l = 0; l < 2; l++) {
      const a = src.readKv(l, 0, 37), b = dst.readKv(l, 0, 37);
      assert.deepEqual(b.k, a.k);
      assert.deepEqual(b.v, a.v);
    }
    using full = model.native.createSequence(64);
    const lf = await full.prefill(ids);
    let maxDiff = 0;
    for (let j = 0; j < lf.length; j++) maxDiff = Math.max(maxDiff, Math.abs(lf[j] - r.logits[j]));
    assert.ok(maxDiff < 1e-4, `logits differ by ${maxDiff}`);
  } finally {
    model.native.free();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("fitLinearProjector() on a model onto itself gives ≈ identity: KV reproduced and recovered ≈ 1", async () => {
  const { model, dir } = await makeModel(22);
  try {
    const ids = model.tokenizer.encode(text.repeat(3));
    const target = alias(model);
    const fit = await fitLinearProjector(model, target, ids, {
      tokens: 1024,
      heldoutTokens: 256,
      windowTokens: 64,
      sourceLayers: "all",
      temperature: false,
      corpus: ["models/README.md"],
    });
    for (const e of fit.meta.layer_map!) {
      assert.ok(e.k_heldout_r2! > 0.999 && e.v_heldout_r2! > 0.999, JSON.stringify(e));
    }
    const d = denseWeights(fit.meta, fit.layers);
    using kernel = new LinearKernel(
      model.native.config,
      model.native.config,
      d.wk,
      d.bk,
      d.wv,
      d.bv,
    );
    const proj: Projector = {
      dir: "",
      meta: fit.meta,
      project: (p, b) => kernel.apply(p, b),
      free: () => Promise.resolve(),
    };
    // projected KV ≈ the model's own KV
    using seq = model.native.createSequence(64);
    await seq.prefill(ids.slice(0, 48));
    const block = readCacheBlock(seq, 0, 48);
    const out = await proj.project(0, block);
    let err = 0, scale = 0;
    for (let i = 0; i < block.k.length; i++) {
      err = Math.max(err, Math.abs(out.k[i] - block.k[i]), Math.abs(out.v[i] - block.v[i]));
      scale = Math.max(scale, Math.abs(block.k[i]));
    }
    console.log(
      `  self-projection: max abs KV error ${err.toExponential(2)} (max |k| ${scale.toFixed(2)})`,
    );
    assert.ok(err < 0.05 * scale);
    const ev = await evaluateMigration(model, target, proj, ids.slice(2000), {
      prefix: 24,
      continuation: 16,
      repairs: [1, 4],
      maxWindows: 4,
    });
    const r1 = ev.repair["1"];
    console.log(
      `  self-projection eval: recovered ${r1.recovered.toFixed(4)}, kl_recovered ${
        r1.kl_recovered.toFixed(4)
      }, top1 ${r1.top1_agreement.toFixed(3)}`,
    );
    assert.ok(r1.kl_recovered > 0.95 && r1.top1_agreement > 0.9);
    assert.ok(Math.abs(r1.recovered - 1) < 0.1);
  } finally {
    model.native.free();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("migrateKv() refuses a different tokenizer, a missing projector and a projector of another pair", async () => {
  const a = await makeModel(23), b = await makeModel(24);
  try {
    using src = a.model.native.createSequence(16);
    await src.prefill([1, 2, 3, 4]);
    using dst = b.model.native.createSequence(16);
    const base = { sourceSeq: src, targetSeq: dst, count: 3 };
    const other = { ...endpointOf(b.model), tokenizerFingerprint: "0".repeat(64) };
    await assert.rejects(
      migrateKv({ ...base, source: endpointOf(a.model), target: other, projector: null }),
      (e: unknown) => e instanceof MigrationRefusedError && e.reason === "tokenizer_mismatch",
    );
    await assert.rejects(
      migrateKv({
        ...base,
        source: endpointOf(a.model),
        target: endpointOf(b.model),
        projector: null,
      }),
      (e: unknown) => e instanceof MigrationRefusedError && e.reason === "no_projector",
    );
    // a projector fitted for a → a-alias is refused for a → b
    const ids = a.model.tokenizer.encode(text);
    const fit = await fitLinearProjector(a.model, alias(a.model), ids, {
      tokens: 128,
      heldoutTokens: 64,
      windowTokens: 64,
      sourceLayers: "all",
      lambda: 1e-3,
      temperature: false,
      corpus: [],
    });
    const proj: Projector = {
      dir: "",
      meta: fit.meta,
      project: () => Promise.reject(new Error("unused")),
      free: () => Promise.resolve(),
    };
    await assert.rejects(
      migrateKv({
        ...base,
        source: endpointOf(a.model),
        target: endpointOf(b.model),
        projector: proj,
      }),
      (e: unknown) => e instanceof MigrationRefusedError && e.reason === "target_mismatch",
    );
    await assert.rejects(
      migrateKv({
        ...base,
        source: endpointOf(b.model),
        target: endpointOf(alias(a.model)),
        projector: proj,
      }),
      (e: unknown) => e instanceof MigrationRefusedError && e.reason === "source_mismatch",
    );
    // bad counts are RangeErrors
    await assert.rejects(
      migrateKv({
        ...base,
        count: 9,
        source: endpointOf(a.model),
        target: endpointOf(a.model),
        projector: null,
      }),
      RangeError,
    );
    assert.equal(argmaxOf([0, 3, 3]), 1);
  } finally {
    a.model.native.free();
    b.model.native.free();
    await Deno.remove(a.dir, { recursive: true });
    await Deno.remove(b.dir, { recursive: true });
  }
});
