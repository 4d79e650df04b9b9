// Chunk frames of a KV snapshot: one chunk = every layer's K and V for a token range, in one
// encoding, with its own scales, framed as (index, tokens, payload, CRC32C[, HMAC tag]).
// Independently decodable. The payload is encoded and decoded natively, straight from and into a
// sequence's cache (kvr_seq_export_chunk / kvr_seq_import_chunk: KvSource / KvSink, see
// native_chunk.ts); here are those seams and the frame check (CRC32C, index, token count) that a
// relay or a signed import runs before any KV is touched. The TypeScript payload codec is the
// tests' oracle (tests/reference/chunk.ts).

import { crc32c } from "./crc32c.ts";
import { SnapshotError } from "./errors.ts";
import { type SnapshotEncoding, TAG_BYTES } from "./format.ts";

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

/** Where a chunk's K/V come from: a sequence with its backend's chunk encoder (nativeSource). */
export interface KvSource {
  /**
   * Writes the unsigned frame (index, tokens, payload, CRC32C) of positions [start, start+tokens)
   * into `frame` (exactly the frame's length).
   */
  exportChunk(
    encoding: SnapshotEncoding,
    groupSize: number,
    index: number,
    start: number,
    tokens: number,
    frame: Uint8Array,
  ): void;
}

/** Where decoded K/V go: a sequence with its backend's chunk decoder (nativeSink). */
export interface KvSink {
  /**
   * Checks the unsigned frame (CRC32C, index, tokens, scales, values), writes every layer of
   * positions [start, start+tokens) and sets the length to start+tokens; writes nothing when a
   * check fails. Throws SnapshotError checksum/format as checkChunkFrame would.
   */
  importChunk(
    encoding: SnapshotEncoding,
    groupSize: number,
    index: number,
    start: number,
    tokens: number,
    frame: Uint8Array,
  ): void;
}

/** Frames at least this large use the codec's CRC32C when it has one. */
const NATIVE_CRC_MIN_BYTES = 4096;

/** CRC32C of a frame's bytes, through the codec's native one for large frames. */
export function frameCrc(bytes: Uint8Array, codec?: KvQuantCodec): number {
  return codec?.crc32c && bytes.length >= NATIVE_CRC_MIN_BYTES
    ? codec.crc32c(bytes)
    : crc32c(bytes);
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
