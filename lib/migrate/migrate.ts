// The migration flow on live sequences: move a prompt prefix's KV from a source sequence into
// an empty target sequence (exact copy for the same model, projector otherwise), then repair —
// the target prefills the last r prompt tokens itself and returns the first token's logits.
// Same tokenizer required (typed refusal otherwise). No HTTP, no gating policy (gate.ts).

import type { LoadedModel } from "../engine/mod.ts";
import type { NativeSequence } from "../native/mod.ts";
import { checkKvValues, SnapshotError } from "../snapshot/mod.ts";
import { MigrationRefusedError } from "./errors.ts";
import { checkProjectorPair, type MigrationEndpoint, type Projector } from "./projector.ts";
import { readCacheBlock, writeCacheBlock } from "./native.ts";

/**
 * The migration view of a loaded model.
 * @param m a model from lib/engine loadModel
 * @returns its endpoint (name, fingerprints, config)
 */
export function endpointOf(m: LoadedModel): MigrationEndpoint {
  return {
    name: m.name,
    fingerprint: m.fingerprint,
    tokenizerFingerprint: m.tokenizer.fingerprint,
    config: m.native.config,
  };
}

/** How a prefix was moved. */
export type MigrationMode = "copy" | "project";

/**
 * Decides how KV moves from source to target: "copy" for the same model fingerprint (no
 * projector needed), "project" when a projector for exactly this pair is given.
 * @param source source model
 * @param target target model
 * @param projector projector (may be null for the same model)
 * @returns the mode
 * @throws MigrationRefusedError: tokenizer_mismatch, no_projector, source/target/geometry mismatch
 */
export function migrationMode(
  source: MigrationEndpoint,
  target: MigrationEndpoint,
  projector: Projector | null,
): MigrationMode {
  if (source.tokenizerFingerprint !== target.tokenizerFingerprint) {
    throw new MigrationRefusedError(
      "tokenizer_mismatch",
      `${source.name} and ${target.name} use different tokenizers (${
        source.tokenizerFingerprint.slice(0, 12)
      }… vs ${target.tokenizerFingerprint.slice(0, 12)}…)`,
    );
  }
  if (source.fingerprint === target.fingerprint) return "copy";
  if (projector === null) {
    throw new MigrationRefusedError(
      "no_projector",
      `no projector for ${source.name} → ${target.name}`,
    );
  }
  checkProjectorPair(projector.meta, source, target);
  return "project";
}

/** Options of {@link migrateKv}. */
export interface MigrateKvOptions {
  source: MigrationEndpoint;
  /** holds at least `count` tokens of the prompt */
  sourceSeq: NativeSequence;
  target: MigrationEndpoint;
  /** empty (length 0), capacity >= count */
  targetSeq: NativeSequence;
  projector: Projector | null;
  /** prefix tokens to move (>= 1) */
  count: number;
  threads?: number;
}

/**
 * Moves KV of positions [0, count) from the source sequence into the empty target sequence and
 * sets the target's length to count. Same model: bit-exact copy in the cache dtype (converted
 * through f32 when the two caches differ in dtype). Otherwise: project with target RoPE
 * re-applied at the same positions — in native memory when the projector has projectInto (linear
 * kind; both sequences are busy until the promise settles), else through f32 blocks in JS.
 * @param o see {@link MigrateKvOptions}
 * @returns the mode used
 * @throws MigrationRefusedError as migrationMode; RangeError when the source holds fewer than
 *   count tokens or the target is not empty / too small; TypeError when a sequence's model does
 *   not have the projector's KV geometry; EngineError from native
 */
export async function migrateKv(o: MigrateKvOptions): Promise<MigrationMode> {
  const mode = migrationMode(o.source, o.target, o.projector);
  if (!Number.isInteger(o.count) || o.count < 1) {
    throw new RangeError(`count must be an integer >= 1, got ${o.count}`);
  }
  if (o.sourceSeq.length < o.count) {
    throw new RangeError(
      `source sequence holds ${o.sourceSeq.length} tokens, cannot migrate ${o.count}`,
    );
  }
  if (o.targetSeq.length !== 0) {
    throw new RangeError(`target sequence must be empty, holds ${o.targetSeq.length} tokens`);
  }
  if (o.targetSeq.capacity < o.count) {
    throw new RangeError(`target capacity ${o.targetSeq.capacity} < ${o.count} tokens`);
  }
  if (mode === "copy") {
    const dt = o.sourceSeq.model.kvDtype === o.targetSeq.model.kvDtype
      ? o.sourceSeq.model.kvDtype
      : "f32";
    for (let l = 0; l < o.source.config.numLayers; l++) {
      const { k, v } = o.sourceSeq.readKv(l, 0, o.count, dt);
      o.targetSeq.writeKv(l, 0, o.count, k, v, dt);
    }
    o.targetSeq.setLength(o.count);
    return mode;
  }
  const projector = o.projector!;
  if (projector.projectInto) {
    // linear kind: read → de-rotate → project → re-rotate → write in native memory
    await projector.projectInto(o.sourceSeq, o.targetSeq, o.count, o.threads ?? 0);
  } else {
    // kinds that compute in JS (onnx): whole f32 blocks through JS
    const block = readCacheBlock(o.sourceSeq, 0, o.count);
    const projected = await projector.project(0, block, o.threads);
    writeCacheBlock(o.targetSeq, 0, projected);
  }
  checkProjected(o.targetSeq, o.count);
  return mode;
}

/**
 * Refuses a projection whose output holds a value no snapshot import would accept (not finite, or
 * beyond KV_MAX_ABS): a projector fitted on ordinary KV can extrapolate an in-bound but unusual
 * input far outside it, and that cache must be neither decoded nor stored or sent as a snapshot
 * that the importing side would refuse. Costs one f32 read of the projected prefix.
 * @param seq the target sequence holding the projection in [0, count)
 * @param count projected tokens
 * @throws {MigrationRefusedError} "projection_out_of_range" naming the first refused element
 */
function checkProjected(seq: NativeSequence, count: number): void {
  const cfg = seq.model.config;
  for (let layer = 0; layer < cfg.numLayers; layer++) {
    const { k, v } = seq.readKv(layer, 0, count, "f32");
    const place = { layer, tokens: count, headDim: cfg.headDim, start: 0 };
    try {
      checkKvValues(k, "f32", "f32", { ...place, part: "K" });
      checkKvValues(v, "f32", "f32", { ...place, part: "V" });
    } catch (e) {
      if (!(e instanceof SnapshotError)) throw e;
      throw new MigrationRefusedError(
        "projection_out_of_range",
        `the projected cache is unusable: ${e.message}`,
      );
    }
  }
}

/** Options of {@link migrateAndRepair}. */
export interface MigrateAndRepairOptions extends Omit<MigrateKvOptions, "count"> {
  /** the full prompt's token ids; the source sequence holds its first tokens */
  prompt: ArrayLike<number>;
  /** tokens the target recomputes itself (>= 1) */
  repair: number;
  /** return all repair positions' logits instead of the last */
  allPositions?: boolean;
}

/** Result of {@link migrateAndRepair}. */
export interface MigrateAndRepairResult {
  /** logits after the prompt's last token (vocab), or (repairTokens, vocab) with allPositions */
  logits: Float32Array;
  mode: MigrationMode | "none";
  migratedTokens: number;
  repairTokens: number;
  /** wall time of the KV move (read, project, write), ms */
  migrateMs: number;
  /** wall time of the repair prefill, ms */
  repairMs: number;
}

/**
 * Migrates prompt[0, n−r) from the source sequence, then prefills prompt[n−r, n) on the target:
 * the target always computes the first token's logits itself. A prompt of at most r tokens is
 * simply prefilled (mode "none").
 * @param o see {@link MigrateAndRepairOptions}
 * @returns the logits and timings
 * @throws RangeError for repair < 1 or an empty prompt; MigrationRefusedError as migrateKv
 */
export async function migrateAndRepair(
  o: MigrateAndRepairOptions,
): Promise<MigrateAndRepairResult> {
  const n = o.prompt.length;
  if (!Number.isInteger(o.repair) || o.repair < 1) {
    throw new RangeError(`repair must be an integer >= 1, got ${o.repair}`);
  }
  if (n < 1) throw new RangeError("prompt is empty");
  const count = Math.max(0, n - o.repair);
  const t0 = performance.now();
  let mode: MigrationMode | "none" = "none";
  if (count > 0) mode = await migrateKv({ ...o, count });
  else migrationMode(o.source, o.target, o.projector); // refusals still apply
  const t1 = performance.now();
  const tail = Array.from({ length: n - count }, (_, i) => o.prompt[count + i]);
  const logits = await o.targetSeq.prefill(tail, { allPositions: o.allPositions === true });
  const t2 = performance.now();
  return {
    logits,
    mode,
    migratedTokens: count,
    repairTokens: n - count,
    migrateMs: t1 - t0,
    repairMs: t2 - t1,
  };
}
