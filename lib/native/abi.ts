// Numeric constants of the C ABI (native/include/kvrelay.h): status codes, dtypes,
// architectures, backends, RoPE scaling kinds and tensor roles. Must change together with the header
// (KVR_ABI_VERSION). No logic beyond name lookups.

import type { WeightRole } from "../model/mod.ts";

/** KVR_ABI_VERSION this binding was written against. */
export const ABI_VERSION = 4;

/** kvr_status code → name (without the KVR_ERR_ prefix). */
export const STATUS_NAMES: Readonly<Record<number, string>> = {
  0: "OK",
  [-1]: "INVALID_ARGUMENT",
  [-2]: "OUT_OF_RANGE",
  [-3]: "CAPACITY",
  [-4]: "IO",
  [-5]: "UNSUPPORTED",
  [-6]: "OUT_OF_MEMORY",
  [-7]: "CORRUPT",
  [-8]: "INTERNAL",
  [-9]: "CHECKSUM",
  [-10]: "POOL_EXHAUSTED",
};

/** KVR_ERR_POOL_EXHAUSTED: a paged sequence needs more KV blocks than its pool has free. */
export const STATUS_POOL_EXHAUSTED = -10;

/** kvr_kv_encoding codes (snapshot chunk encodings; 0–2 coincide with kvr_dtype). */
export const ENCODING_CODE = { f32: 0, f16: 1, bf16: 2, q8: 3, q4: 4 } as const;

/** A snapshot chunk encoding (kvr_kv_encoding). */
export type KvEncoding = keyof typeof ENCODING_CODE;

/** kvr_dtype codes by safetensors / KV dtype name. */
export const DTYPE_CODE = { F32: 0, F16: 1, BF16: 2, f32: 0, f16: 1, bf16: 2 } as const;

/** kvr_arch codes by ModelConfig.family. */
export const ARCH_CODE = { llama: 1, qwen2: 2, qwen3: 3 } as const;

/** kvr_backend codes ("auto" is resolved in TypeScript: lib/native/backend.ts). */
export const BACKEND_CODE = { cpu: 0, cuda: 1 } as const;

/** kvr_weight_format codes: in-memory format of the linear weights ("bf16" = as stored). */
export const WEIGHTS_CODE = { bf16: 0, q8: 1, q4: 2, f32: 3 } as const;

/** kvr_cpu_kernel codes: how far a model's CPU computations may go among the kernel paths the
 *  CPU has ("auto" = every path; the others narrow it, so one machine checks each path it runs). */
export const CPU_KERNEL_CODE = { auto: 0, generic: 1, avx2: 2, avxvnni: 3, avx512: 4 } as const;

/** kvr_rope_scaling codes. */
export const ROPE_CODE = { none: 0, linear: 1, llama3: 2 } as const;

/** kvr_tensor_role codes by lib/model WeightRole. */
export const ROLE_CODE: Readonly<Record<WeightRole, number>> = {
  embed: 1,
  final_norm: 2,
  lm_head: 3,
  attn_norm: 10,
  q: 11,
  k: 12,
  v: 13,
  o: 14,
  q_bias: 15,
  k_bias: 16,
  v_bias: 17,
  o_bias: 18,
  q_norm: 19,
  k_norm: 20,
  mlp_norm: 21,
  gate: 22,
  up: 23,
  down: 24,
  gate_bias: 25,
  up_bias: 26,
  down_bias: 27,
};

/** sizeof(kvr_model_params) and sizeof(kvr_tensor_desc) in bytes. */
export const MODEL_PARAMS_BYTES = 96;
export const TENSOR_DESC_BYTES = 64;
