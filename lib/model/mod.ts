// lib/model: Hugging Face checkpoints — config.json parsing, safetensors headers, sharded
// indexes, tensor-name → role mapping and the model fingerprint. No weights are loaded here and
// nothing here calls native code (lib/native does).

export { ModelFormatError } from "./errors.ts";
export {
  type Architecture,
  type GenerationSampling,
  type ModelConfig,
  parseModelConfig,
  readGenerationEosIds,
  readGenerationSampling,
  readModelConfig,
  type RopeScaling,
} from "./config.ts";
export {
  encodeSafetensors,
  MAX_HEADER_BYTES,
  readSafetensorsHeader,
  readTensorBytes,
  type SafetensorsDtype,
  safetensorsDtypeSize,
  type SafetensorsEntry,
  type TensorInfo,
} from "./safetensors.ts";
export {
  classifyTensorName,
  expectedShape,
  mapWeights,
  requiredLayerRoles,
  type WeightEntry,
  type WeightRole,
} from "./weights.ts";
export { canonicalJson, computationalConfig, computeFingerprint } from "./fingerprint.ts";
export { type Checkpoint, loadCheckpoint, type LoadCheckpointOptions } from "./checkpoint.ts";
