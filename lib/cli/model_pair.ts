// The two models of a migration command (source → target, loaded with the same native options
// unless the target's are given)
// and the projector between them, released together by `await using`. Flag parsing is in
// command.ts (parsePairOptions, parseModelLoadOptions); what runs on the pair is in each command.

import { type LoadedModel, loadModel } from "../engine/mod.ts";
import { endpointOf, loadProjector, type Projector } from "../migrate/mod.ts";
import type { NativeModelOptions } from "../native/mod.ts";
import { type PairDirs, UsageError } from "./command.ts";

/** Source and target models, and the projector source → target when one was loaded. */
export interface ModelPair extends AsyncDisposable {
  source: LoadedModel;
  target: LoadedModel;
  /** null when none was loaded (fit; or source and target are the same model). */
  projector: Projector | null;
}

/**
 * Loads the source and target models with the same native options (no projector).
 *
 * @param dirs from parsePairOptions (projectorDir is ignored)
 * @param native from parseModelLoadOptions
 * @param targetNative the target's options when they differ (e.g. its weight format)
 * @returns the pair; disposing it frees the projector (if any), then source, then target
 * @throws whatever loadModel throws (ModelFormatError, TokenizerError, EngineError); a model
 *   already loaded is freed first
 */
export async function loadModelPair(
  dirs: PairDirs,
  native: NativeModelOptions,
  targetNative: NativeModelOptions = native,
): Promise<ModelPair> {
  const source = await loadModel(dirs.sourceDir, native);
  let target: LoadedModel;
  try {
    target = await loadModel(dirs.targetDir, targetNative);
  } catch (e) {
    source.native.free();
    throw e;
  }
  const pair: ModelPair = {
    source,
    target,
    projector: null,
    async [Symbol.asyncDispose]() {
      await pair.projector?.free();
      source.native.free();
      target.native.free();
    },
  };
  return pair;
}

/**
 * loadModelPair, then the projector in `dirs.projectorDir`, checked against both models.
 *
 * @param dirs from parsePairOptions; projectorDir may be absent only for the same model
 * @param native from parseModelLoadOptions
 * @param targetNative the target's options when they differ (default: native)
 * @returns the pair with its projector (null when projectorDir is absent)
 * @throws {UsageError} when projectorDir is absent and the models' fingerprints differ;
 *   whatever loadModel/loadProjector throw. The models are freed before any throw.
 */
export async function loadMigrationPair(
  dirs: PairDirs,
  native: NativeModelOptions,
  targetNative: NativeModelOptions = native,
): Promise<ModelPair> {
  const pair = await loadModelPair(dirs, native, targetNative);
  try {
    if (dirs.projectorDir !== undefined) {
      pair.projector = await loadProjector(
        dirs.projectorDir,
        endpointOf(pair.source),
        endpointOf(pair.target),
      );
    } else if (pair.source.fingerprint !== pair.target.fingerprint) {
      throw new UsageError("--projector is required for different models");
    }
  } catch (e) {
    await pair[Symbol.asyncDispose]();
    throw e;
  }
  return pair;
}
