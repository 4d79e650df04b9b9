// KV cache / KV buffer element types as TypeScript names, their byte sizes and validation.
// Not the safetensors weight dtypes (those are "F32"/"F16"/"BF16" in lib/model).

/** Element type of a KV cache or KV read/write buffer. */
export type KvDtype = "f32" | "f16" | "bf16";

const SIZES: Record<KvDtype, number> = { f32: 4, f16: 2, bf16: 2 };

/**
 * Bytes per element of a KV dtype.
 * @param d "f32" | "f16" | "bf16"
 * @returns 4 or 2
 * @throws TypeError for another value
 */
export function dtypeByteSize(d: KvDtype): number {
  assertKvDtype(d);
  return SIZES[d];
}

/**
 * Checks that a value is a KvDtype.
 * @param d the value
 * @param what the parameter name for the message
 * @throws TypeError quoting the value otherwise
 */
export function assertKvDtype(d: unknown, what = "dtype"): asserts d is KvDtype {
  if (typeof d !== "string" || !(d in SIZES)) {
    throw new TypeError(`${what} must be "f32", "f16" or "bf16", got ${JSON.stringify(d)}`);
  }
}
