// The native q8/q4 KV quantizer (libkvrelay kvr_kv_quantize_* / kvr_kv_dequantize_*) and CRC32C
// as a KvQuantCodec for the chunk codec. Checks shapes before FFI; a dequantizer rejecting stored
// scales (KVR_ERR_CORRUPT) becomes SnapshotError "format". Not the format logic (chunk_frame.ts).

import { EngineError, type NativeLibrary, openNativeLibrary } from "../native/mod.ts";
import type { KvQuantCodec } from "./chunk_frame.ts";
import { SnapshotError } from "./errors.ts";

const KVR_ERR_CORRUPT = -7;

function checkShape(fn: string, heads: number, tokens: number, headDim: number, axis: number) {
  for (const [k, v] of [["heads", heads], ["tokens", tokens], ["headDim", headDim]] as const) {
    if (!Number.isInteger(v) || v < 1 || v > 0xffffffff) {
      throw new RangeError(`${fn}: ${k} must be an integer >= 1, got ${v}`);
    }
  }
  if (axis !== 0 && axis !== 1) throw new RangeError(`${fn}: axis must be 0 or 1, got ${axis}`);
  const n = heads * tokens * headDim;
  if (n > 2 ** 31) throw new RangeError(`${fn}: block of ${n} elements is too large`);
  return n;
}

function checkLen(fn: string, what: string, got: number, want: number) {
  if (got !== want) throw new RangeError(`${fn}: ${what} has ${got} elements, expected ${want}`);
}

/** The native quantizer bound to one opened library. */
export class NativeKvCodec implements KvQuantCodec {
  readonly #lib: NativeLibrary;

  /**
   * @param lib opened libkvrelay (default: openNativeLibrary())
   * @throws Error when the library cannot be opened
   */
  constructor(lib: NativeLibrary = openNativeLibrary()) {
    this.#lib = lib;
  }

  #dequantStatus(status: number, call: string): void {
    if (status === 0) return;
    const err = new EngineError(status, this.#lib.lastError(), call);
    if (status === KVR_ERR_CORRUPT) throw new SnapshotError("format", err.message, { cause: err });
    throw err;
  }

  /**
   * CRC32C through the library (SSE4.2 when available); equals crc32c.ts.
   * @param bytes data
   * @param crc running CRC to extend (default 0)
   * @returns the CRC as an unsigned 32-bit number
   */
  crc32c(bytes: Uint8Array, crc = 0): number {
    const out = new Uint32Array(1);
    this.#lib.check(
      this.#lib.symbols.kvr_crc32c(bytes, BigInt(bytes.length), crc >>> 0, out),
      "kvr_crc32c",
    );
    return out[0];
  }

  /** q8 (symmetric, absmax/127). @throws RangeError on shapes, EngineError on non-finite input */
  quantizeQ8(x: Float32Array, heads: number, tokens: number, headDim: number, axis: number) {
    const n = checkShape("quantizeQ8", heads, tokens, headDim, axis);
    checkLen("quantizeQ8", "x", x.length, n);
    const codes = new Int8Array(n);
    const scales = new Float32Array(axis === 0 ? heads * headDim : heads * tokens);
    this.#lib.check(
      this.#lib.symbols.kvr_kv_quantize_q8(
        x,
        BigInt(n),
        heads,
        tokens,
        headDim,
        axis,
        codes,
        BigInt(n),
        scales,
        BigInt(scales.length),
      ),
      "kvr_kv_quantize_q8",
    );
    return { codes, scales };
  }

  /** q8 decode. @throws RangeError on shapes, SnapshotError format on corrupt scales */
  dequantizeQ8(
    codes: Int8Array,
    scales: Float32Array,
    heads: number,
    tokens: number,
    headDim: number,
    axis: number,
  ): Float32Array {
    const n = checkShape("dequantizeQ8", heads, tokens, headDim, axis);
    checkLen("dequantizeQ8", "codes", codes.length, n);
    checkLen(
      "dequantizeQ8",
      "scales",
      scales.length,
      axis === 0 ? heads * headDim : heads * tokens,
    );
    const out = new Float32Array(n);
    this.#dequantStatus(
      this.#lib.symbols.kvr_kv_dequantize_q8(
        codes,
        BigInt(n),
        scales,
        BigInt(scales.length),
        heads,
        tokens,
        headDim,
        axis,
        out,
        BigInt(n),
      ),
      "kvr_kv_dequantize_q8",
    );
    return out;
  }

  /** q4 (asymmetric, group-wise). @throws RangeError on shapes, EngineError on non-finite input */
  quantizeQ4(
    x: Float32Array,
    heads: number,
    tokens: number,
    headDim: number,
    axis: number,
    group: number,
  ) {
    const n = checkShape("quantizeQ4", heads, tokens, headDim, axis);
    checkLen("quantizeQ4", "x", x.length, n);
    if (!Number.isInteger(group) || group < 1 || group > 1024) {
      throw new RangeError(`quantizeQ4: group must be in [1, 1024], got ${group}`);
    }
    const ng = q4Groups(heads, tokens, headDim, axis, group);
    const codes = new Uint8Array(Math.ceil(n / 2));
    const scales = new Float32Array(ng);
    const mins = new Float32Array(ng);
    this.#lib.check(
      this.#lib.symbols.kvr_kv_quantize_q4(
        x,
        BigInt(n),
        heads,
        tokens,
        headDim,
        axis,
        group,
        codes,
        BigInt(codes.length),
        scales,
        BigInt(ng),
        mins,
        BigInt(ng),
      ),
      "kvr_kv_quantize_q4",
    );
    return { codes, scales, mins };
  }

  /** q4 decode. @throws RangeError on shapes, SnapshotError format on corrupt scales/mins */
  dequantizeQ4(
    codes: Uint8Array,
    scales: Float32Array,
    mins: Float32Array,
    heads: number,
    tokens: number,
    headDim: number,
    axis: number,
    group: number,
  ): Float32Array {
    const n = checkShape("dequantizeQ4", heads, tokens, headDim, axis);
    if (!Number.isInteger(group) || group < 1 || group > 1024) {
      throw new RangeError(`dequantizeQ4: group must be in [1, 1024], got ${group}`);
    }
    const ng = q4Groups(heads, tokens, headDim, axis, group);
    checkLen("dequantizeQ4", "codes", codes.length, Math.ceil(n / 2));
    checkLen("dequantizeQ4", "scales", scales.length, ng);
    checkLen("dequantizeQ4", "mins", mins.length, ng);
    const out = new Float32Array(n);
    this.#dequantStatus(
      this.#lib.symbols.kvr_kv_dequantize_q4(
        codes,
        BigInt(codes.length),
        scales,
        BigInt(ng),
        mins,
        BigInt(ng),
        heads,
        tokens,
        headDim,
        axis,
        group,
        out,
        BigInt(n),
      ),
      "kvr_kv_dequantize_q4",
    );
    return out;
  }
}

function q4Groups(heads: number, tokens: number, headDim: number, axis: number, group: number) {
  return axis === 0
    ? heads * Math.ceil(tokens / group) * headDim
    : heads * tokens * Math.ceil(headDim / group);
}
