// lib/native: the TypeScript face of libkvrelay (the project's only Deno.dlopen) — open the
// library, load a model from a lib/model Checkpoint, run sequences (prefill/decode/KV access),
// GEMM entry points, and the native twin of lib/engine's sampler (NativeSampler). No
// tokenization, sampling policy or scheduling (lib/engine).

export { EngineError, NoAllowedTokenError, NoFiniteLogitError } from "./errors.ts";
export { assertKvDtype, dtypeByteSize, type KvDtype } from "./dtype.ts";
export { ENCODING_CODE, type KvEncoding } from "./abi.ts";
export { NativeLibrary, openNativeLibrary } from "./library.ts";
export { NativeModel, type NativeModelOptions } from "./model.ts";
export { NativeSequence } from "./sequence.ts";
export { KvPool } from "./kv_pool.ts";
export {
  type BatchItem,
  type BatchResult,
  type DecodeStepsItem,
  type DecodeStepsResult,
  MAX_BATCH_SEQS,
  MAX_BATCH_TOKENS,
} from "./batch.ts";
export { STATUS_POOL_EXHAUSTED } from "./abi.ts";
export {
  type LogprobRequest,
  NativeSampler,
  type NativeSamplingOptions,
  type SampleResult,
} from "./sampler.ts";
export {
  CPU_KERNELS,
  type CpuKernel,
  encodeModelParams,
  encodePaths,
  encodeTensorTable,
  type NativeBackend,
  WEIGHT_FORMATS,
  type WeightFormat,
} from "./layout.ts";
export {
  autoFallbackWords,
  BACKEND_CHOICES,
  type BackendChoice,
  type BackendProbe,
  BackendUnavailableError,
  probeBackend,
  resolveBackend,
  type ResolvedBackend,
} from "./backend.ts";
