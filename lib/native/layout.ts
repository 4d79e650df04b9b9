// Byte layouts of the C structs kvr_model_params (96 bytes) and kvr_tensor_desc (64 bytes per
// row), and the NUL-separated path list, written with DataView at the offsets documented in
// native/include/kvrelay.h (little-endian). No FFI calls here.

import type { ModelConfig, WeightEntry } from "../model/mod.ts";
import { concatBytes } from "../util/mod.ts";
import {
  ARCH_CODE,
  BACKEND_CODE,
  CPU_KERNEL_CODE,
  DTYPE_CODE,
  MODEL_PARAMS_BYTES,
  ROLE_CODE,
  ROPE_CODE,
  TENSOR_DESC_BYTES,
  WEIGHTS_CODE,
} from "./abi.ts";
import { quoteValue } from "./check.ts";
import type { KvDtype } from "./dtype.ts";

/** A compute backend of libkvrelay (kvr_backend). */
export type NativeBackend = keyof typeof BACKEND_CODE;

/** In-memory linear-weight format (kvr_weight_format): "bf16" keeps the checkpoint's precision
 *  (BF16 stays bf16, F32/F16 become f32); "q8" is 8-bit with per-32 block scales, "q4" 4-bit with
 *  an f16 scale and offset per 32; "f32" widens BF16 weights to f32 at load (the same results as
 *  bf16 at twice the memory: the bf16 path's oracle in tests). q8, q4 and f32: CPU only. */
export type WeightFormat = keyof typeof WEIGHTS_CODE;

/** The formats a tier or the CLI offers (f32 is a library option: NativeModel.load). */
export const WEIGHT_FORMATS: readonly WeightFormat[] = ["bf16", "q8", "q4"];

/** The CPU kernel paths a computation may use (kvr_cpu_kernel, kvrelay.h): "auto" every path the
 *  CPU has; "generic" the portable kernels; "avx2" no AVX-512 or AVX-VNNI; "avxvnni" no AVX-512;
 *  "avx512" no AMX. A path the CPU lacks stays off whatever the value. */
export type CpuKernel = keyof typeof CPU_KERNEL_CODE;

/** Every CpuKernel, for option checks. */
export const CPU_KERNELS = Object.keys(CPU_KERNEL_CODE) as CpuKernel[];

/**
 * Checks a CpuKernel option.
 * @param name the option's name, for the message
 * @param value the value given
 * @returns the value
 * @throws RangeError naming the option when the value is not a CpuKernel
 */
export function checkCpuKernel(name: string, value: unknown): CpuKernel {
  if (typeof value !== "string" || !Object.hasOwn(CPU_KERNEL_CODE, value)) {
    throw new RangeError(
      `${name} must be one of ${CPU_KERNELS.join(", ")}, got ${quoteValue(value)}`,
    );
  }
  return value as CpuKernel;
}

/**
 * Lays out kvr_model_params for a config.
 * @param config model geometry (lib/model)
 * @param kvDtype KV cache element type
 * @param threads worker threads (0 = all cores)
 * @param backend compute backend (default "cpu")
 * @param device CUDA device ordinal (0 for the CPU)
 * @param weights linear-weight format (default "bf16" = as stored)
 * @param cpuKernel CPU kernel paths the model may use (default "auto")
 * @returns 96 bytes
 */
export function encodeModelParams(
  config: ModelConfig,
  kvDtype: KvDtype,
  threads: number,
  backend: NativeBackend = "cpu",
  device = 0,
  weights: WeightFormat = "bf16",
  cpuKernel: CpuKernel = "auto",
): Uint8Array {
  const buf = new Uint8Array(MODEL_PARAMS_BYTES);
  const v = new DataView(buf.buffer);
  const u32 = (off: number, x: number) => v.setUint32(off, x, true);
  const f32 = (off: number, x: number) => v.setFloat32(off, x, true);
  const rope = config.ropeScaling;
  u32(0, ARCH_CODE[config.family]);
  u32(4, config.vocabSize);
  u32(8, config.hiddenSize);
  u32(12, config.intermediateSize);
  u32(16, config.numLayers);
  u32(20, config.numHeads);
  u32(24, config.numKvHeads);
  u32(28, config.headDim);
  f32(32, config.rmsNormEps);
  f32(36, config.ropeTheta);
  u32(40, rope === null ? ROPE_CODE.none : ROPE_CODE[rope.type]);
  f32(44, rope === null ? 1 : rope.factor);
  f32(48, rope?.type === "llama3" ? rope.lowFreqFactor : 0);
  f32(52, rope?.type === "llama3" ? rope.highFreqFactor : 0);
  u32(56, rope?.type === "llama3" ? rope.originalMaxPosition : 0);
  u32(60, config.tieWordEmbeddings ? 1 : 0);
  u32(64, config.attentionBias ? 1 : 0);
  u32(68, config.mlpBias ? 1 : 0);
  u32(72, DTYPE_CODE[kvDtype]);
  u32(76, threads);
  u32(80, BACKEND_CODE[backend]);
  u32(84, device);
  u32(88, WEIGHTS_CODE[weights]);
  u32(92, CPU_KERNEL_CODE[cpuKernel]);
  return buf;
}

/**
 * Lays out the kvr_tensor_desc table.
 * @param entries weights with roles (lib/model mapWeights)
 * @param files the path list; each entry's tensor.file must be in it
 * @returns 64 × entries.length bytes
 * @throws RangeError when a tensor's file is not in `files` or a shape has more than 2 dims
 */
export function encodeTensorTable(entries: WeightEntry[], files: string[]): Uint8Array {
  const buf = new Uint8Array(TENSOR_DESC_BYTES * entries.length);
  const v = new DataView(buf.buffer);
  entries.forEach((e, i) => {
    const o = i * TENSOR_DESC_BYTES;
    const fileIndex = files.indexOf(e.tensor.file);
    if (fileIndex < 0) {
      throw new RangeError(
        `tensor "${e.tensor.name}": file ${JSON.stringify(e.tensor.file)} is not in the path list`,
      );
    }
    const shape = e.tensor.shape;
    if (shape.length < 1 || shape.length > 2) {
      throw new RangeError(`tensor "${e.tensor.name}": ndim ${shape.length} is not 1 or 2`);
    }
    v.setUint32(o + 0, ROLE_CODE[e.role], true);
    v.setUint32(o + 4, e.layer, true);
    v.setUint32(o + 8, fileIndex, true);
    v.setUint32(o + 12, DTYPE_CODE[e.tensor.dtype], true);
    v.setUint32(o + 16, shape.length, true);
    v.setUint32(o + 20, 0, true);
    v.setBigUint64(o + 24, BigInt(shape[0]), true);
    v.setBigUint64(o + 32, BigInt(shape.length === 2 ? shape[1] : 1), true);
    v.setBigUint64(o + 40, BigInt(e.tensor.offset), true);
    v.setBigUint64(o + 48, BigInt(e.tensor.nbytes), true);
    v.setBigUint64(o + 56, 0n, true);
  });
  return buf;
}

/**
 * Encodes paths as UTF-8, each NUL-terminated, back to back.
 * @param paths file paths (must not contain NUL)
 * @returns the bytes
 * @throws TypeError when a path contains a NUL character
 */
export function encodePaths(paths: string[]): Uint8Array {
  const enc = new TextEncoder();
  const parts = paths.map((p) => {
    if (p.includes("\0")) throw new TypeError(`path ${JSON.stringify(p)} contains a NUL character`);
    return enc.encode(`${p}\0`);
  });
  return concatBytes(parts);
}
