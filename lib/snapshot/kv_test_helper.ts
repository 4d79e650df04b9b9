// Test helper: an in-memory KV cache (layers × {K,V} × (heads, capacity, headDim)) with the same
// readKv/writeKv/setLength contract as NativeSequence, plus f32↔bf16/f16 conversions in plain
// TypeScript, so the format can be tested without the engine; it encodes and decodes chunk frames
// with the reference codec (tests/reference/chunk.ts; q8/q4 through the native quantizers).
// Test-only; not exported by mod.ts.

import { mulberry32 } from "../util/mod.ts";
import type { CacheDtype, SnapshotEncoding } from "./format.ts";
import type { KvQuantCodec } from "./chunk_frame.ts";
import { NativeKvCodec } from "./native_codec.ts";
import { referenceSink, referenceSource } from "../../tests/reference/chunk.ts";

let quantCodec: KvQuantCodec | undefined;
/** The native q8/q4 quantizers, opened on first use (f32/f16/bf16 tests need no library). */
function lazyCodec(): KvQuantCodec {
  return {
    crc32c: undefined,
    quantizeQ8: (...a) => (quantCodec ??= new NativeKvCodec()).quantizeQ8(...a),
    dequantizeQ8: (...a) => (quantCodec ??= new NativeKvCodec()).dequantizeQ8(...a),
    quantizeQ4: (...a) => (quantCodec ??= new NativeKvCodec()).quantizeQ4(...a),
    dequantizeQ4: (...a) => (quantCodec ??= new NativeKvCodec()).dequantizeQ4(...a),
  };
}

/** f32 → bf16 bits, round to nearest even (NaN kept quiet). */
export function f32ToBf16(x: number): number {
  const u = new Uint32Array(new Float32Array([x]).buffer)[0];
  if ((u & 0x7fffffff) > 0x7f800000) return ((u >>> 16) | 0x40) & 0xffff;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

/** bf16 bits → f32 value. */
export function bf16ToF32(h: number): number {
  return new Float32Array(new Uint32Array([h << 16]).buffer)[0];
}

/** Rounds a value to what `dtype` can hold (RNE). */
export function roundTo(dtype: CacheDtype, x: number): number {
  if (dtype === "bf16") return bf16ToF32(f32ToBf16(x));
  if (dtype === "f16") return new Float16Array([x])[0];
  return Math.fround(x);
}

function encodeAs(dtype: CacheDtype, x: Float32Array): Uint8Array {
  if (dtype === "f32") return new Uint8Array(x.slice().buffer);
  if (dtype === "f16") return new Uint8Array(Float16Array.from(x).buffer);
  const out = new Uint16Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = f32ToBf16(x[i]);
  return new Uint8Array(out.buffer);
}

function decodeAs(dtype: CacheDtype, b: Uint8Array): Float32Array {
  const c = b.slice();
  if (dtype === "f32") return new Float32Array(c.buffer);
  if (dtype === "f16") return Float32Array.from(new Float16Array(c.buffer));
  const h = new Uint16Array(c.buffer);
  const out = new Float32Array(h.length);
  for (let i = 0; i < h.length; i++) out[i] = bf16ToF32(h[i]);
  return out;
}

/** Deterministic PRNG in [0, 1) (mulberry32, lib/util). */
export const rng: (seed: number) => () => number = mulberry32;

/** An in-memory KV cache holding values already rounded to its dtype. */
export class MemoryKv {
  readonly k: Float32Array[];
  readonly v: Float32Array[];
  length = 0;
  writes = 0;

  constructor(
    readonly layers: number,
    readonly heads: number,
    readonly headDim: number,
    readonly capacity: number,
    readonly dtype: CacheDtype,
  ) {
    const n = heads * capacity * headDim;
    this.k = Array.from({ length: layers }, () => new Float32Array(n));
    this.v = Array.from({ length: layers }, () => new Float32Array(n));
  }

  /** Fills `tokens` positions with seeded KV-like values (outlier channels) in its dtype. */
  static random(
    layers: number,
    heads: number,
    headDim: number,
    tokens: number,
    dtype: CacheDtype,
    seed: number,
  ): MemoryKv {
    const kv = new MemoryKv(layers, heads, headDim, tokens, dtype);
    const r = rng(seed);
    for (const arr of [...kv.k, ...kv.v]) {
      for (let i = 0; i < arr.length; i++) {
        const ch = i % headDim;
        arr[i] = roundTo(dtype, (r() + r() + r() - 1.5) * 2 * (ch % 5 === 0 ? 6 : 1));
      }
    }
    kv.length = tokens;
    return kv;
  }

  #range(arr: Float32Array, start: number, count: number): Float32Array {
    const out = new Float32Array(this.heads * count * this.headDim);
    for (let h = 0; h < this.heads; h++) {
      const src = (h * this.capacity + start) * this.headDim;
      out.set(arr.subarray(src, src + count * this.headDim), h * count * this.headDim);
    }
    return out;
  }

  readKv(layer: number, start: number, count: number, dtype: CacheDtype = this.dtype) {
    if (start + count > this.length) throw new RangeError(`read past length ${this.length}`);
    return {
      k: encodeAs(dtype, this.#range(this.k[layer], start, count)),
      v: encodeAs(dtype, this.#range(this.v[layer], start, count)),
    };
  }

  writeKv(
    layer: number,
    start: number,
    count: number,
    k: Uint8Array,
    v: Uint8Array,
    dtype: CacheDtype = this.dtype,
  ): void {
    if (start > this.length || start + count > this.capacity) {
      throw new RangeError(`write [${start}, ${start + count}) with length ${this.length}`);
    }
    const per = this.heads * count * this.headDim;
    for (const [arr, bytes] of [[this.k[layer], k], [this.v[layer], v]] as const) {
      const x = decodeAs(dtype, bytes);
      if (x.length !== per) throw new RangeError(`write of ${x.length} elements, expected ${per}`);
      for (let h = 0; h < this.heads; h++) {
        for (let i = 0; i < count * this.headDim; i++) {
          arr[(h * this.capacity + start) * this.headDim + i] = roundTo(
            this.dtype,
            x[h * count * this.headDim + i],
          );
        }
      }
    }
    this.writes++;
  }

  /** The dtype imported values are checked against (default each block's own dtype). */
  checkAs: CacheDtype | undefined;

  /** Encodes chunk frame `index` of [start, start+tokens) with the reference codec. */
  exportChunk(
    encoding: SnapshotEncoding,
    groupSize: number,
    index: number,
    start: number,
    tokens: number,
    frame: Uint8Array,
  ): void {
    referenceSource(this, this.#geometry(), lazyCodec())
      .exportChunk(encoding, groupSize, index, start, tokens, frame);
  }

  /** Checks and decodes chunk frame `index` with the reference codec, then writes it. */
  importChunk(
    encoding: SnapshotEncoding,
    groupSize: number,
    index: number,
    start: number,
    tokens: number,
    frame: Uint8Array,
  ): void {
    referenceSink(this, this.#geometry(), {
      codec: lazyCodec(),
      cacheDtype: this.checkAs,
    }).importChunk(encoding, groupSize, index, start, tokens, frame);
  }

  #geometry() {
    return { numLayers: this.layers, numKvHeads: this.heads, headDim: this.headDim };
  }

  setLength(n: number): void {
    if (n > this.capacity) throw new RangeError(`length ${n} > capacity ${this.capacity}`);
    this.length = n;
  }

  /** Positions [start, start+count) of every layer equal `other`'s at the same positions. */
  equalRange(other: MemoryKv, start: number, count: number): boolean {
    for (let l = 0; l < this.layers; l++) {
      for (const [a, b] of [[this.k[l], other.k[l]], [this.v[l], other.v[l]]]) {
        for (let h = 0; h < this.heads; h++) {
          for (let i = 0; i < count * this.headDim; i++) {
            const x = a[(h * this.capacity + start) * this.headDim + i];
            const y = b[(h * other.capacity + start) * this.headDim + i];
            if (!Object.is(x, y)) return false;
          }
        }
      }
    }
    return true;
  }
}
