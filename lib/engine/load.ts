// loadModel: a Hugging Face checkpoint directory → checkpoint + native weights + tokenizer,
// ready for generation. It loads; it does not generate or cache models across calls.

import { type Checkpoint, type GenerationSampling, loadCheckpoint } from "../model/mod.ts";
import { NativeModel, type NativeModelOptions } from "../native/mod.ts";
import { Tokenizer, TokenizerError } from "../tokenizer/mod.ts";

/** A model ready to generate with. Free it with `model.native.free()`. */
export interface LoadedModel {
  /** Directory base name, e.g. "tiny-fast". */
  name: string;
  /** Absolute checkpoint directory. */
  dir: string;
  checkpoint: Checkpoint;
  native: NativeModel;
  tokenizer: Tokenizer;
  /** Stop ids by default: config.json and generation_config.json eos_token_id, merged. */
  eosTokenIds: number[];
  /** Sampling defaults from generation_config.json (a tier's `sampling` overrides them). */
  samplingDefaults: GenerationSampling;
  /** The model fingerprint (lib/model), hex SHA-256. */
  fingerprint: string;
  /** Where the load's time went (ms). */
  loadMs: LoadTimings;
}

/** Wall time of each loading phase, ms. */
export interface LoadTimings {
  /** config.json + safetensors headers + fingerprint (lib/model). */
  checkpoint: number;
  /** tokenizer.json + tokenizer_config.json. */
  tokenizer: number;
  /** Native load: mmap, conversion to the compute layout, packing (off the JS thread, at the
   *  same time as the tokenizer: the two overlap). */
  weights: number;
}

/**
 * Loads a checkpoint directory: config + safetensors headers (lib/model), weights into the native
 * engine (mmapped), tokenizer.json + tokenizer_config.json.
 *
 * @param dir checkpoint directory
 * @param opts native options: kvDtype (default "f32"), threads (default all cores), lib
 * @returns the loaded model
 * @throws {ModelFormatError} for a missing or invalid checkpoint
 * @throws {TokenizerError} for a missing or invalid tokenizer, or one with more ids than the
 *   model's vocabulary
 * @throws {EngineError} when the native load fails
 */
export async function loadModel(dir: string, opts: NativeModelOptions = {}): Promise<LoadedModel> {
  const t0 = performance.now();
  const checkpoint = await loadCheckpoint(dir);
  const t1 = performance.now();
  // The weights load on a worker thread while the tokenizer is parsed on this one: a start
  // costs the longer of the two, not their sum (Qwen3-0.6B: seconds each on 2 cores).
  let t3 = t1;
  const nativeLoad = NativeModel.loadAsync(checkpoint, opts).then((m) => {
    t3 = performance.now();
    return m;
  });
  nativeLoad.catch(() => {}); // handled when awaited below; not an unhandled rejection meanwhile
  let tokenizer: Tokenizer;
  try {
    tokenizer = await Tokenizer.load(checkpoint.dir);
  } catch (e) {
    await nativeLoad.then((m) => m.free(), () => {});
    throw e;
  }
  const t2 = performance.now();
  const native = await nativeLoad;
  if (tokenizer.vocabSize > checkpoint.config.vocabSize) {
    native.free();
    throw new TokenizerError(
      `tokenizer has ${tokenizer.vocabSize} ids but the model's vocab_size is ${checkpoint.config.vocabSize}`,
      `${checkpoint.dir}/tokenizer.json`,
    );
  }
  return {
    name: checkpoint.dir.split("/").filter((p) => p.length > 0).pop() ?? checkpoint.dir,
    dir: checkpoint.dir,
    checkpoint,
    native,
    tokenizer,
    eosTokenIds: [...checkpoint.config.eosTokenIds],
    samplingDefaults: { ...checkpoint.generation },
    fingerprint: checkpoint.fingerprint,
    loadMs: { checkpoint: t1 - t0, tokenizer: t2 - t1, weights: t3 - t1 },
  };
}
