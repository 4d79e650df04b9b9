// The TypeScript chunk payload codec: the oracle of the native one (native/src/core/chunk_codec.cpp,
// kvr_seq_export_chunk / kvr_seq_import_chunk), byte for byte. Encodes a chunk frame from KV read
// per layer (kvr_seq_kv_read or the tests' in-memory cache), quantizing through a KvQuantCodec,
// and decodes one into KV written per layer; referenceSource / referenceSink give the snapshot
// stream these as its KvSource / KvSink. No production code imports it.

import {
  AXIS_PER_CHANNEL,
  AXIS_PER_TOKEN,
  checkChunkFrame,
  frameCrc,
  type KvQuantCodec,
  type KvSink,
  type KvSource,
} from "../../lib/snapshot/chunk_frame.ts";
import { checkKvValues } from "../../lib/snapshot/finite.ts";
import { NativeKvCodec } from "../../lib/snapshot/native_codec.ts";
import type { NativeSequence } from "../../lib/native/mod.ts";
import { SnapshotError } from "../../lib/snapshot/errors.ts";
import {
  type CacheDtype,
  CHUNK_FRAME_BYTES,
  layerPayloadBytes,
  type SnapshotEncoding,
} from "../../lib/snapshot/format.ts";

/** KV read as kvr_seq_kv_read gives it: a NativeSequence or the tests' in-memory cache. */
export interface KvReader {
  /** (kv_heads, count, head_dim) bytes in dtype; keys post-RoPE. */
  readKv(
    layer: number,
    start: number,
    count: number,
    dtype?: CacheDtype,
  ): { k: Uint8Array; v: Uint8Array };
}

/** KV written as kvr_seq_kv_write takes it. */
export interface KvWriter {
  writeKv(
    layer: number,
    start: number,
    count: number,
    k: Uint8Array,
    v: Uint8Array,
    dtype?: CacheDtype,
  ): void;
  /** Called after every layer of a chunk was written: positions < nTokens now hold K/V. */
  setLength?(nTokens: number): void;
}

/** Shape parameters a chunk codec needs. */
export interface ChunkShape {
  encoding: SnapshotEncoding;
  numLayers: number;
  numKvHeads: number;
  headDim: number;
  groupSize: number;
}

function needCodec(codec: KvQuantCodec | undefined, enc: string): KvQuantCodec {
  if (!codec) throw new TypeError(`encoding ${enc} needs a native quantization codec`);
  return codec;
}

function asF32(b: Uint8Array): Float32Array {
  const copy = b.byteOffset % 4 === 0 ? b : b.slice();
  return new Float32Array(copy.buffer, copy.byteOffset, copy.byteLength / 4);
}

function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/**
 * Encodes the unsigned chunk frame (index, tokens, payload, CRC32C) of [start, start+tokens) by
 * reading every layer from `kv`, into `frame` (exactly the frame's length, zero-filled).
 * @throws TypeError when a quantized encoding lacks a codec; RangeError when `frame` has the
 *   wrong length
 */
export function encodeChunk(
  shape: ChunkShape,
  kv: KvReader,
  index: number,
  start: number,
  tokens: number,
  frame: Uint8Array,
  codec?: KvQuantCodec,
): void {
  const { encoding, numLayers: L, numKvHeads: H, headDim: D, groupSize } = shape;
  const layerBytes = layerPayloadBytes(encoding, H, D, tokens, groupSize);
  const bytes = CHUNK_FRAME_BYTES + L * layerBytes;
  if (frame.length !== bytes) {
    throw new RangeError(`encodeChunk(): frame holds ${frame.length} bytes, the frame ${bytes}`);
  }
  const dv = new DataView(frame.buffer, frame.byteOffset, frame.byteLength);
  dv.setUint32(0, index, true);
  dv.setUint32(4, tokens, true);
  let p = 8;
  const put = (b: Uint8Array) => {
    frame.set(b, p);
    p += b.length;
  };
  for (let l = 0; l < L; l++) {
    if (encoding === "f32" || encoding === "f16" || encoding === "bf16") {
      const { k, v } = kv.readKv(l, start, tokens, encoding);
      put(k);
      put(v);
      continue;
    }
    const q = needCodec(codec, encoding);
    const { k, v } = kv.readKv(l, start, tokens, "f32");
    const kf = asF32(k), vf = asF32(v);
    if (encoding === "q8") {
      const kq = q.quantizeQ8(kf, H, tokens, D, AXIS_PER_CHANNEL);
      put(bytesOf(kq.scales));
      put(bytesOf(kq.codes));
      const vq = q.quantizeQ8(vf, H, tokens, D, AXIS_PER_TOKEN);
      put(bytesOf(vq.scales));
      put(bytesOf(vq.codes));
    } else {
      for (const [x, axis] of [[kf, AXIS_PER_CHANNEL], [vf, AXIS_PER_TOKEN]] as const) {
        const r = q.quantizeQ4(x, H, tokens, D, axis, groupSize);
        put(bytesOf(r.scales));
        put(bytesOf(r.mins));
        put(r.codes);
      }
    }
  }
  if (p !== 8 + L * layerBytes) throw new Error(`chunk encoder wrote ${p - 8} payload bytes`);
  dv.setUint32(p, frameCrc(frame.subarray(0, p), codec), true);
}

/** One decoded layer: K and V bytes (kv_heads, tokens, head_dim) in `dtype`. */
export interface DecodedLayer {
  k: Uint8Array;
  v: Uint8Array;
  dtype: CacheDtype;
}

/**
 * Decodes a checked chunk frame's payload into per-layer K/V (float encodings: the stored bytes
 * in their own dtype, bit-exact; q8/q4: dequantized f32).
 * @returns one entry per layer
 * @throws SnapshotError bounds (payload size) or format (corrupt scales reported by the codec)
 */
export function decodeChunkPayload(
  shape: ChunkShape,
  frame: Uint8Array,
  tokens: number,
  codec?: KvQuantCodec,
): DecodedLayer[] {
  const { encoding, numLayers: L, numKvHeads: H, headDim: D, groupSize: G } = shape;
  const layerBytes = layerPayloadBytes(encoding, H, D, tokens, G);
  if (frame.length < CHUNK_FRAME_BYTES + L * layerBytes) {
    throw new SnapshotError("bounds", `chunk payload shorter than ${L * layerBytes} bytes`);
  }
  const n = H * tokens * D;
  const out: DecodedLayer[] = [];
  let p = 8;
  const take = (len: number) => {
    const b = frame.slice(p, p + len); // copy: aligned, owned
    p += len;
    return b;
  };
  for (let l = 0; l < L; l++) {
    if (encoding === "f32" || encoding === "f16" || encoding === "bf16") {
      const half = layerBytes / 2;
      out.push({ k: take(half), v: take(half), dtype: encoding });
      continue;
    }
    const q = needCodec(codec, encoding);
    if (encoding === "q8") {
      const ks = new Float32Array(take(4 * H * D).buffer);
      const kc = new Int8Array(take(n).buffer);
      const vs = new Float32Array(take(4 * H * tokens).buffer);
      const vc = new Int8Array(take(n).buffer);
      const k = q.dequantizeQ8(kc, ks, H, tokens, D, AXIS_PER_CHANNEL);
      const v = q.dequantizeQ8(vc, vs, H, tokens, D, AXIS_PER_TOKEN);
      out.push({ k: bytesOf(k), v: bytesOf(v), dtype: "f32" });
    } else {
      const kg = H * Math.ceil(tokens / G) * D;
      const vg = H * tokens * Math.ceil(D / G);
      const packed = Math.ceil(n / 2);
      const ks = new Float32Array(take(4 * kg).buffer);
      const km = new Float32Array(take(4 * kg).buffer);
      const kc = take(packed);
      const vs = new Float32Array(take(4 * vg).buffer);
      const vm = new Float32Array(take(4 * vg).buffer);
      const vc = take(packed);
      const k = q.dequantizeQ4(kc, ks, km, H, tokens, D, AXIS_PER_CHANNEL, G);
      const v = q.dequantizeQ4(vc, vs, vm, H, tokens, D, AXIS_PER_TOKEN, G);
      out.push({ k: bytesOf(k), v: bytesOf(v), dtype: "f32" });
    }
  }
  return out;
}

/** A cache's geometry: what a chunk of it holds besides the encoding. */
export interface KvGeometry {
  numLayers: number;
  numKvHeads: number;
  headDim: number;
}

/**
 * A KvSource encoding in TypeScript from `kv`'s readKv: the bytes the native encoder must equal.
 * @param kv the KV to read
 * @param geometry its layers, heads and head size
 * @param codec q8/q4 quantizer (and CRC32C)
 */
export function referenceSource(
  kv: KvReader,
  geometry: KvGeometry,
  codec?: KvQuantCodec,
): KvSource {
  return {
    exportChunk(encoding, groupSize, index, start, tokens, frame) {
      encodeChunk({ ...geometry, encoding, groupSize }, kv, index, start, tokens, frame, codec);
    },
  };
}

/**
 * A KvSink decoding in TypeScript into `kv`'s writeKv: checks the frame (CRC32C, index, tokens),
 * decodes it, refuses values the cache cannot hold (checkKvValues in `cacheDtype`, default each
 * block's own dtype), then writes every layer and sets the length.
 * @param kv where the KV goes
 * @param geometry its layers, heads and head size
 * @param opts q8/q4 dequantizer (and CRC32C), the cache's dtype
 */
export function referenceSink(
  kv: KvWriter,
  geometry: KvGeometry,
  opts: { codec?: KvQuantCodec; cacheDtype?: CacheDtype } = {},
): KvSink {
  return {
    importChunk(encoding, groupSize, index, start, tokens, frame) {
      checkChunkFrame(frame, index, tokens, false, opts.codec);
      const shape = { ...geometry, encoding, groupSize };
      const layers = decodeChunkPayload(shape, frame, tokens, opts.codec);
      for (let l = 0; l < layers.length; l++) {
        const { k, v, dtype } = layers[l];
        const into = opts.cacheDtype ?? dtype;
        const place = { chunk: index, layer: l, tokens, headDim: geometry.headDim, start };
        checkKvValues(k, dtype, into, { ...place, part: "K" });
        checkKvValues(v, dtype, into, { ...place, part: "V" });
      }
      for (let l = 0; l < layers.length; l++) {
        kv.writeKv(l, start, tokens, layers[l].k, layers[l].v, layers[l].dtype);
      }
      kv.setLength?.(start + tokens);
    },
  };
}

/**
 * A native sequence read through kvr_seq_kv_read and encoded by the reference codec.
 * @param seq the source sequence
 * @param codec q8/q4 quantizer (default the native quantizers)
 */
export function readKvSource(seq: NativeSequence, codec: KvQuantCodec = quantizers()): KvSource {
  return referenceSource(seq, geometryOfSequence(seq), codec);
}

/**
 * A native sequence written through kvr_seq_kv_write by the reference decoder.
 * @param seq the destination sequence
 * @param opts q8/q4 dequantizer (default the native ones), the cache dtype values are checked in
 */
export function writeKvSink(
  seq: NativeSequence,
  opts: { codec?: KvQuantCodec; cacheDtype?: CacheDtype } = {},
): KvSink {
  return referenceSink(seq, geometryOfSequence(seq), { codec: quantizers(), ...opts });
}

function geometryOfSequence(seq: NativeSequence): KvGeometry {
  const c = seq.model.config;
  return { numLayers: c.numLayers, numKvHeads: c.numKvHeads, headDim: c.headDim };
}

let nativeQuantizers: KvQuantCodec | undefined;
function quantizers(): KvQuantCodec {
  return nativeQuantizers ??= new NativeKvCodec();
}
