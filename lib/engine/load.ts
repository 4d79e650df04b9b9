// loadModel: a Hugging Face checkpoint directory → checkpoint + native weights + tokenizer,
// ready for generation. It loads; it does not generate or cache models across calls.

import { type Checkpoint, loadCheckpoint } from "../model/mod.ts";
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
  /** The model fingerprint (lib/model), hex SHA-256. */
  fingerprint: string;
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
  const checkpoint = await loadCheckpoint(dir);
  const tokenizer = await Tokenizer.load(checkpoint.dir);
  if (tokenizer.vocabSize > checkpoint.config.vocabSize) {
    throw new TokenizerError(
      `tokenizer has ${tokenizer.vocabSize} ids but the model's vocab_size is ${checkpoint.config.vocabSize}`,
      `${checkpoint.dir}/tokenizer.json`,
    );
  }
  const native = NativeModel.load(checkpoint, opts);
  return {
    name: checkpoint.dir.split("/").filter((p) => p.length > 0).pop() ?? checkpoint.dir,
    dir: checkpoint.dir,
    checkpoint,
    native,
    tokenizer,
    eosTokenIds: [...checkpoint.config.eosTokenIds],
    fingerprint: checkpoint.fingerprint,
  };
}
