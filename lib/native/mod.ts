// lib/native: the TypeScript face of libkvrelay (the project's only Deno.dlopen) — open the
// library, load a model from a lib/model Checkpoint, run sequences (prefill/decode/KV access),
// GEMM entry points. No tokenization, sampling or scheduling (lib/engine).

export { EngineError } from "./errors.ts";
export { assertKvDtype, dtypeByteSize, type KvDtype } from "./dtype.ts";
export { NativeLibrary, openNativeLibrary } from "./library.ts";
export { NativeModel, type NativeModelOptions } from "./model.ts";
export { NativeSequence } from "./sequence.ts";
export { KvPool } from "./kv_pool.ts";
export { type BatchItem, MAX_BATCH_SEQS, MAX_BATCH_TOKENS } from "./batch.ts";
export { STATUS_POOL_EXHAUSTED } from "./abi.ts";
export { cpuKernelName, gemmBench, gemmF32 } from "./gemm.ts";
export { encodeModelParams, encodePaths, encodeTensorTable } from "./layout.ts";
