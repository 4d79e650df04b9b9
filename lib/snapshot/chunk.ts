// Chunk frame codec: one chunk = every layer's K and V for a token range, in one encoding, with
// its own scales, framed as (index, tokens, payload, CRC32C[, HMAC tag]). Independently
// decodable. Quantization itself is delegated to a KvQuantCodec (native, see native_codec.ts); a
// source or sink with its own native chunk codec (NativeSequence: exportChunk / importChunk, the
// backend encodes from and decodes into its cache) is used instead when present.

import { crc32c } from "./crc32c.ts";
import { SnapshotError } from "./errors.ts";
import {
  type CacheDtype,
  CHUNK_FRAME_BYTES,
  layerPayloadBytes,
  type SnapshotEncoding,
  TAG_BYTES,
} from "./format.ts";

/** Scale axis: per channel (keys) or per token (values); codes match kvr_quant_axis. */
export const AXIS_PER_CHANNEL = 0;
export const AXIS_PER_TOKEN = 1;

/** q8/q4 (de)quantizer over (heads, tokens, headDim) f32 blocks; implemented natively. */
export interface KvQuantCodec {
  /** Optional fast CRC32C (same result as crc32c.ts), used for large chunk frames. */
  crc32c?(bytes: Uint8Array, crc?: number): number;
  quantizeQ8(
    x: Float32Array,
    heads: number,
    tokens: number,
    headDim: number,
    axis: number,
  ): { codes: Int8Array; scales: Float32Array };
  dequantizeQ8(
    codes: Int8Array,
    scales: Float32Array,
    heads: number,
    tokens: number,
    headDim: number,
    axis: number,
  ): Float32Array;
  quantizeQ4(
    x: Float32Array,
    heads: number,
    tokens: number,
    headDim: number,
    axis: number,
    group: number,
  ): { codes: Uint8Array; scales: Float32Array; mins: Float32Array };
  dequantizeQ4(
    codes: Uint8Array,
    scales: Float32Array,
    mins: Float32Array,
    heads: number,
    tokens: number,
    headDim: number,
    axis: number,
    group: number,
  ): Float32Array;
}

/** Where a chunk's K/V come from: the engine's NativeSequence satisfies this. */
export interface KvSource {
  /** (kv_heads, count, head_dim) bytes in dtype; keys post-RoPE. */
  readKv(
    layer: number,
    start: number,
    count: number,
    dtype?: CacheDtype,
  ): { k: Uint8Array; v: Uint8Array };
  /**
   * Optional native chunk encoder: writes the unsigned frame (index, tokens, payload, CRC32C) of
   * positions [start, start+tokens) into `frame`, byte-identical to encodeChunk over readKv.
   */
  exportChunk?(
    encoding: SnapshotEncoding,
    groupSize: number,
    index: number,
    start: number,
    tokens: number,
    frame: Uint8Array,
  ): void;
}

/** Where decoded K/V go: the engine's NativeSequence satisfies this. */
export interface KvSink {
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
  /**
   * Optional native chunk decoder: checks the unsigned frame (CRC32C, index, tokens, scales),
   * writes every layer of positions [start, start+tokens) and sets the length to start+tokens;
   * writes nothing when a check fails. Throws SnapshotError checksum/format as checkChunkFrame
   * and decodeChunkPayload would.
   */
  importChunk?(
    encoding: SnapshotEncoding,
    groupSize: number,
    index: number,
    start: number,
    tokens: number,
    frame: Uint8Array,
  ): void;
}

/** Shape parameters a chunk codec needs. */
export interface ChunkShape {
  encoding: SnapshotEncoding;
  numLayers: number;
  numKvHeads: number;
  headDim: number;
  groupSize: number;
}

/** Frames at least this large use the codec's CRC32C when it has one. */
const NATIVE_CRC_MIN_BYTES = 4096;

function frameCrc(bytes: Uint8Array, codec?: KvQuantCodec): number {
  return codec?.crc32c && bytes.length >= NATIVE_CRC_MIN_BYTES
    ? codec.crc32c(bytes)
    : crc32c(bytes);
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
 * Encodes one chunk frame by reading every layer of [start, start+tokens) from `source`.
 * @param index chunk index (stored, checked on decode)
 * @param start source position of the chunk's first token
 * @param signed reserve TAG_BYTES zero bytes at the end for the HMAC tag (filled by the caller)
 * @param into zero-filled bytes of exactly the frame's length to encode into (a slice of a whole
 *   snapshot: encodeSnapshot); default a new array
 * @returns the frame bytes (`into` when given)
 * @throws TypeError when a quantized encoding lacks a codec; RangeError when `into` has the wrong
 *   length; EngineError from the source
 */
export function encodeChunk(
  shape: ChunkShape,
  source: KvSource,
  index: number,
  start: number,
  tokens: number,
  signed: boolean,
  codec?: KvQuantCodec,
  into?: Uint8Array,
): Uint8Array {
  const { encoding, numLayers: L, numKvHeads: H, headDim: D, groupSize } = shape;
  const layerBytes = layerPayloadBytes(encoding, H, D, tokens, groupSize);
  const bytes = CHUNK_FRAME_BYTES + L * layerBytes + (signed ? TAG_BYTES : 0);
  if (into !== undefined && into.length !== bytes) {
    throw new RangeError(`encodeChunk(): into holds ${into.length} bytes, the frame ${bytes}`);
  }
  const frame = into ?? new Uint8Array(bytes);
  if (source.exportChunk) {
    const end = frame.length - (signed ? TAG_BYTES : 0);
    source.exportChunk(encoding, groupSize, index, start, tokens, frame.subarray(0, end));
    return frame;
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
      const { k, v } = source.readKv(l, start, tokens, encoding);
      put(k);
      put(v);
      continue;
    }
    const q = needCodec(codec, encoding);
    const { k, v } = source.readKv(l, start, tokens, "f32");
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
  return frame;
}

/** One decoded layer: K and V bytes (kv_heads, tokens, head_dim) in `dtype`. */
export interface DecodedLayer {
  k: Uint8Array;
  v: Uint8Array;
  dtype: CacheDtype;
}

/**
 * Checks a chunk frame's CRC, index and token count (the HMAC tag, if any, is the caller's).
 * @throws SnapshotError checksum/format
 */
export function checkChunkFrame(
  frame: Uint8Array,
  index: number,
  tokens: number,
  signed: boolean,
  codec?: KvQuantCodec,
): void {
  const end = frame.length - (signed ? TAG_BYTES : 0) - 4;
  if (end < 8) throw new SnapshotError("bounds", `chunk ${index} frame of ${frame.length} bytes`);
  const dv = new DataView(frame.buffer, frame.byteOffset, frame.byteLength);
  const stored = dv.getUint32(end, true);
  const crc = frameCrc(frame.subarray(0, end), codec);
  if (stored !== crc) {
    throw new SnapshotError(
      "checksum",
      `chunk ${index} checksum mismatch: stored crc32c 0x${stored.toString(16)}, computed 0x${
        crc.toString(16)
      }`,
    );
  }
  const gotIndex = dv.getUint32(0, true);
  const gotTokens = dv.getUint32(4, true);
  if (gotIndex !== index || gotTokens !== tokens) {
    throw new SnapshotError(
      "format",
      `chunk frame says index ${gotIndex}/${gotTokens} tokens where the table expects ${index}/${tokens}`,
    );
  }
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
