// The `.kvs` snapshot byte layout (docs/snapshot-format.md): constants, hard limits, the header
// type, header encode/decode with every integer bounds-checked, and chunk-size arithmetic.
// Pure TypeScript, no I/O, no engine: chunk frames in chunk_frame.ts (payloads are coded natively), streams in stream.ts.

import { fromHex, hex } from "../util/mod.ts";
import { crc32c, crc32cUpdate } from "./crc32c.ts";
import { SnapshotError } from "./errors.ts";

/** File magic: "\x89KVSNAP\n" (8 bytes; the high byte and LF catch text-mode mangling). */
export const MAGIC: Uint8Array = new Uint8Array([0x89, 0x4b, 0x56, 0x53, 0x4e, 0x41, 0x50, 0x0a]);
/** Major format version this code writes and reads; readers reject any other major. */
export const VERSION_MAJOR = 1;
/** Newest minor format version this code writes (1.1: provenance block); readers accept any minor
 *  of a known major. A snapshot without provenance is still written as 1.0, byte for byte. */
export const VERSION_MINOR = 1;
/** Minor version that introduced the provenance block appended after the chunk table. */
export const PROVENANCE_MINOR = 1;
/** Bytes of the provenance block: u32 flags, 32-byte source model fingerprint, u32 repair. */
export const PROVENANCE_BYTES = 40;
/** Provenance flags bit 0: the KV was projected from another model (cross-model migration). */
export const PROVENANCE_MIGRATED = 1;
/** Flags bit 0: the snapshot carries HMAC-SHA256 tags (header tag + one per chunk). */
export const FLAG_SIGNED = 1;
/** Every flag bit this version knows; any other set bit is a format error. */
export const KNOWN_FLAGS = FLAG_SIGNED;

/** Bytes of the fixed prefix: magic, major, minor, flags, header_length, header_crc32c. */
export const PREFIX_BYTES = 24;
/** Bytes of the fixed part of the header body (before key id, token ids, chunk table). */
export const HEADER_FIXED_BYTES = 156;
/** Bytes of one chunk-table row: u64 offset, u32 length, u32 tokens. */
export const CHUNK_TABLE_ROW_BYTES = 16;
/** Bytes of an HMAC-SHA256 tag. */
export const TAG_BYTES = 32;
/** Chunk frame overhead without tag: u32 index, u32 tokens, …payload…, u32 crc32c. */
export const CHUNK_FRAME_BYTES = 12;
/** Default tokens per chunk. */
export const DEFAULT_CHUNK_TOKENS = 256;
/** Default q4 group size (tokens for keys, channels for values). */
export const DEFAULT_Q4_GROUP = 32;

/** Hard limits a reader enforces before allocating anything sized by the header. */
export const LIMITS = {
  maxLayers: 512,
  maxKvHeads: 256,
  maxHeadDim: 1024,
  /** KV tokens + pending tokens. */
  maxTokens: 1 << 20,
  maxChunkTokens: 65536,
  maxGroupSize: 1024,
  maxKeyIdBytes: 64,
  /** Header body bytes (fixed part + key id + 4·tokens + 16·chunks fits with room). */
  maxHeaderBytes: 24 << 20,
  /** One chunk frame is held in memory whole while decoding. */
  maxChunkBytes: 512 << 20,
  /** Absolute ceiling on a snapshot, whatever maxBytes a caller configures (64 GiB). */
  maxTotalBytes: 2 ** 36,
} as const;

/** Default maximum snapshot size a reader accepts (configurable per call). */
export const DEFAULT_MAX_BYTES = 2 ** 31;

/** Payload encodings; codes 0–2 coincide with kvr_dtype. */
export type SnapshotEncoding = "f32" | "f16" | "bf16" | "q8" | "q4";
/** Element types of a KV cache (and of lossless encodings). */
export type CacheDtype = "f32" | "f16" | "bf16";

export const ENCODING_CODES: Readonly<Record<SnapshotEncoding, number>> = {
  f32: 0,
  f16: 1,
  bf16: 2,
  q8: 3,
  q4: 4,
};
const ENCODING_NAMES: readonly SnapshotEncoding[] = ["f32", "f16", "bf16", "q8", "q4"];
const DTYPE_NAMES: readonly CacheDtype[] = ["f32", "f16", "bf16"];

/** RoPE scaling kinds, coded as kvr_rope_scaling. */
export interface SnapshotRope {
  theta: number;
  /** 0 none, 1 linear, 2 llama3 */
  scaling: 0 | 1 | 2;
  factor: number;
  lowFreqFactor: number;
  highFreqFactor: number;
  originalMaxPosition: number;
}

/** Architecture geometry a snapshot's KV is only meaningful for. */
export interface SnapshotGeometry {
  /** kvr_arch: 1 llama/mistral, 2 qwen2, 3 qwen3 */
  architecture: number;
  numLayers: number;
  numKvHeads: number;
  headDim: number;
  rope: SnapshotRope;
}

/** One chunk-table row; offsets are relative to the first chunk's first byte. */
export interface ChunkEntry {
  offset: number;
  length: number;
  tokens: number;
}

/** Where a snapshot's KV came from when it is not simply this model's own prefill (1.1+). */
export interface SnapshotProvenance {
  /** The KV was projected from another model's KV (cross-model migration). */
  migrated: boolean;
  /** Fingerprint of the model that first computed this KV (lowercase hex SHA-256). */
  sourceModelFingerprint: string;
  /** Prompt tokens the migration left for the target to recompute (the pending repair tail). */
  repairTokens: number;
}

/** Everything the header says. Fingerprints are lowercase hex SHA-256 (64 chars). */
export interface SnapshotHeader {
  versionMajor: number;
  versionMinor: number;
  flags: number;
  modelFingerprint: string;
  tokenizerFingerprint: string;
  geometry: SnapshotGeometry;
  cacheDtype: CacheDtype;
  encoding: SnapshotEncoding;
  chunkTokens: number;
  /** q4 group size; 0 for every other encoding. */
  groupSize: number;
  /** Position of the first KV token (keys carry RoPE for positionOffset + i). */
  positionOffset: number;
  /** Ids of the tokens whose K/V the chunks hold, (n_tokens). */
  tokenIds: Uint32Array;
  /** Ids that follow them without stored K/V: the importer prefills these (the repair tail). */
  pendingTokenIds: Uint32Array;
  chunks: ChunkEntry[];
  /** HMAC key id when signed, else null. */
  keyId: string | null;
  /** Provenance block (format 1.1+; absent in 1.0 snapshots and in this model's own exports). */
  provenance?: SnapshotProvenance;
}

/** Sizes derived from a header: where things start and the exact total. */
export interface SnapshotLayout {
  headerLength: number;
  /** Offset of the first chunk: prefix + header + header tag when signed. */
  payloadStart: number;
  totalBytes: number;
}

function fail(
  kind: "format" | "bounds" | "version" | "checksum" | "too_large",
  msg: string,
): never {
  throw new SnapshotError(kind, msg);
}

/**
 * Payload bytes of one layer's K plus V for `tokens` tokens in `encoding`.
 * @returns bytes (exact integer; callers check it against limits)
 */
export function layerPayloadBytes(
  encoding: SnapshotEncoding,
  kvHeads: number,
  headDim: number,
  tokens: number,
  groupSize: number,
): number {
  const n = kvHeads * tokens * headDim;
  switch (encoding) {
    case "f32":
      return 2 * 4 * n;
    case "f16":
    case "bf16":
      return 2 * 2 * n;
    case "q8":
      // K: scales (H, D) f32 + codes; V: scales (H, T) f32 + codes.
      return 4 * kvHeads * headDim + n + 4 * kvHeads * tokens + n;
    case "q4": {
      // K: groups along tokens: (H, ceil(T/G), D) scale+min f32; V: (H, T, ceil(D/G)).
      const packed = Math.ceil(n / 2);
      const kGroups = kvHeads * Math.ceil(tokens / groupSize) * headDim;
      const vGroups = kvHeads * tokens * Math.ceil(headDim / groupSize);
      return 8 * kGroups + packed + 8 * vGroups + packed;
    }
  }
}

/**
 * Bytes of one chunk frame (index, tokens, payload for every layer, CRC, optional tag).
 * @returns frame length in bytes
 */
export function chunkFrameBytes(
  encoding: SnapshotEncoding,
  geometry: Pick<SnapshotGeometry, "numLayers" | "numKvHeads" | "headDim">,
  tokens: number,
  groupSize: number,
  signed: boolean,
): number {
  return CHUNK_FRAME_BYTES + (signed ? TAG_BYTES : 0) +
    geometry.numLayers *
      layerPayloadBytes(encoding, geometry.numKvHeads, geometry.headDim, tokens, groupSize);
}

/**
 * Builds the chunk table a valid snapshot with these parameters must have.
 * @returns rows in order, contiguous from offset 0
 */
export function expectedChunkTable(
  encoding: SnapshotEncoding,
  geometry: Pick<SnapshotGeometry, "numLayers" | "numKvHeads" | "headDim">,
  nTokens: number,
  chunkTokens: number,
  groupSize: number,
  signed: boolean,
): ChunkEntry[] {
  const rows: ChunkEntry[] = [];
  let offset = 0;
  for (let start = 0; start < nTokens; start += chunkTokens) {
    const tokens = Math.min(chunkTokens, nTokens - start);
    const length = chunkFrameBytes(encoding, geometry, tokens, groupSize, signed);
    rows.push({ offset, length, tokens });
    offset += length;
  }
  return rows;
}

function hexToBytes(hex: string, what: string): Uint8Array {
  if (typeof hex !== "string" || !/^[0-9a-f]{64}$/i.test(hex)) {
    throw new TypeError(`${what} must be 64 hex digits (SHA-256), got ${JSON.stringify(hex)}`);
  }
  return fromHex(hex);
}

function checkUint(value: number, max: number, what: string, min = 0): void {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new RangeError(`${what} must be an integer in [${min}, ${max}], got ${value}`);
  }
}

/**
 * Checks a header's fields against the hard limits and its own consistency (chunk count and table,
 * group size, key id). Used by the writer (RangeError/TypeError: caller bug) — the reader has its
 * own checks that raise SnapshotError.
 * @throws RangeError/TypeError naming the field
 */
export function validateHeaderForWrite(h: SnapshotHeader): void {
  const g = h.geometry;
  checkUint(g.numLayers, LIMITS.maxLayers, "numLayers", 1);
  checkUint(g.numKvHeads, LIMITS.maxKvHeads, "numKvHeads", 1);
  checkUint(g.headDim, LIMITS.maxHeadDim, "headDim", 1);
  checkUint(g.architecture, 0xffffffff, "architecture");
  checkUint(h.chunkTokens, LIMITS.maxChunkTokens, "chunkTokens", 1);
  checkUint(h.positionOffset, 0xffffffff, "positionOffset");
  if (h.tokenIds.length + h.pendingTokenIds.length > LIMITS.maxTokens) {
    throw new RangeError(
      `tokens + pending tokens must be <= ${LIMITS.maxTokens}, got ${
        h.tokenIds.length + h.pendingTokenIds.length
      }`,
    );
  }
  if (!(h.encoding in ENCODING_CODES)) {
    throw new TypeError(`encoding must be one of ${ENCODING_NAMES.join(", ")}, got ${h.encoding}`);
  }
  if (!DTYPE_NAMES.includes(h.cacheDtype)) {
    throw new TypeError(`cacheDtype must be f32, f16 or bf16, got ${h.cacheDtype}`);
  }
  if (h.encoding === "q4") checkUint(h.groupSize, LIMITS.maxGroupSize, "groupSize", 1);
  else if (h.groupSize !== 0) {
    throw new RangeError(`groupSize must be 0 for encoding ${h.encoding}, got ${h.groupSize}`);
  }
  const r = g.rope;
  for (const [k, v] of Object.entries(r)) {
    if (typeof v !== "number" || !Number.isFinite(v)) {
      throw new TypeError(`rope.${k} must be a finite number, got ${v}`);
    }
  }
  checkUint(r.scaling, 2, "rope.scaling");
  checkUint(r.originalMaxPosition, 0xffffffff, "rope.originalMaxPosition");
  if (h.keyId !== null) {
    const kb = new TextEncoder().encode(h.keyId);
    if (kb.length < 1 || kb.length > LIMITS.maxKeyIdBytes) {
      throw new RangeError(
        `keyId must be 1..${LIMITS.maxKeyIdBytes} UTF-8 bytes, got ${kb.length}`,
      );
    }
  }
  if (((h.flags & FLAG_SIGNED) !== 0) !== (h.keyId !== null)) {
    throw new TypeError("flags signed bit and keyId must agree");
  }
  if (h.provenance !== undefined) {
    if (h.versionMinor < PROVENANCE_MINOR) {
      throw new RangeError(
        `provenance needs format version 1.${PROVENANCE_MINOR}, got 1.${h.versionMinor}`,
      );
    }
    hexToBytes(h.provenance.sourceModelFingerprint, "provenance.sourceModelFingerprint");
    checkUint(h.provenance.repairTokens, 0xffffffff, "provenance.repairTokens");
  } else if (h.versionMinor !== 0) {
    throw new RangeError(`format version 1.${h.versionMinor} needs provenance; 1.0 has none`);
  }
}

/**
 * Encodes prefix + header body (CRC filled in). The chunk table is taken from `h.chunks`.
 * @param h header; `h.chunks` must be the expected table for its parameters
 * @returns the bytes [0, PREFIX_BYTES + header_length)
 * @throws RangeError/TypeError when a field is out of its limit
 */
export function encodeHeader(h: SnapshotHeader): Uint8Array {
  validateHeaderForWrite(h);
  const keyId = h.keyId === null ? new Uint8Array(0) : new TextEncoder().encode(h.keyId);
  const nIds = h.tokenIds.length + h.pendingTokenIds.length;
  const headerLength = HEADER_FIXED_BYTES + keyId.length + 4 * nIds +
    CHUNK_TABLE_ROW_BYTES * h.chunks.length + (h.provenance ? PROVENANCE_BYTES : 0);
  if (headerLength > LIMITS.maxHeaderBytes) {
    throw new RangeError(`header of ${headerLength} bytes exceeds ${LIMITS.maxHeaderBytes}`);
  }
  const out = new Uint8Array(PREFIX_BYTES + headerLength);
  const dv = new DataView(out.buffer);
  out.set(MAGIC, 0);
  dv.setUint16(8, h.versionMajor, true);
  dv.setUint16(10, h.versionMinor, true);
  dv.setUint32(12, h.flags, true);
  dv.setUint32(16, headerLength, true);
  const b = PREFIX_BYTES;
  out.set(hexToBytes(h.modelFingerprint, "modelFingerprint"), b);
  out.set(hexToBytes(h.tokenizerFingerprint, "tokenizerFingerprint"), b + 32);
  const g = h.geometry;
  const u32 = (off: number, v: number) => dv.setUint32(b + off, v, true);
  const f64 = (off: number, v: number) => dv.setFloat64(b + off, v, true);
  u32(64, g.architecture);
  u32(68, g.numLayers);
  u32(72, g.numKvHeads);
  u32(76, g.headDim);
  u32(80, DTYPE_NAMES.indexOf(h.cacheDtype));
  u32(84, ENCODING_CODES[h.encoding]);
  u32(88, h.chunkTokens);
  u32(92, h.groupSize);
  u32(96, g.rope.scaling);
  u32(100, g.rope.originalMaxPosition);
  f64(104, g.rope.theta);
  f64(112, g.rope.factor);
  f64(120, g.rope.lowFreqFactor);
  f64(128, g.rope.highFreqFactor);
  u32(136, h.positionOffset);
  u32(140, h.tokenIds.length);
  u32(144, h.pendingTokenIds.length);
  u32(148, h.chunks.length);
  u32(152, keyId.length);
  let p = b + HEADER_FIXED_BYTES;
  out.set(keyId, p);
  p += keyId.length;
  for (const ids of [h.tokenIds, h.pendingTokenIds]) {
    for (let i = 0; i < ids.length; i++, p += 4) dv.setUint32(p, ids[i], true);
  }
  for (const c of h.chunks) {
    dv.setBigUint64(p, BigInt(c.offset), true);
    dv.setUint32(p + 8, c.length, true);
    dv.setUint32(p + 12, c.tokens, true);
    p += CHUNK_TABLE_ROW_BYTES;
  }
  if (h.provenance) {
    dv.setUint32(p, h.provenance.migrated ? PROVENANCE_MIGRATED : 0, true);
    out.set(hexToBytes(h.provenance.sourceModelFingerprint, "sourceModelFingerprint"), p + 4);
    dv.setUint32(p + 36, h.provenance.repairTokens, true);
  }
  dv.setUint32(20, headerCrc(out.subarray(0, 20), out.subarray(PREFIX_BYTES)), true);
  return out;
}

function headerCrc(prefix20: Uint8Array, body: Uint8Array): number {
  return crc32cUpdate(body, crc32c(prefix20));
}

/** The fixed prefix, parsed and checked (magic, version, flags, header length limit). */
export interface SnapshotPrefix {
  versionMajor: number;
  versionMinor: number;
  flags: number;
  headerLength: number;
  headerCrc: number;
}

/**
 * Parses and checks the 24-byte prefix.
 * @param bytes at least PREFIX_BYTES bytes
 * @throws SnapshotError format (magic, flags, header length), version (unknown major), bounds
 */
export function decodePrefix(bytes: Uint8Array): SnapshotPrefix {
  if (bytes.length < PREFIX_BYTES) {
    fail(
      "bounds",
      `snapshot truncated: ${bytes.length} bytes, the fixed prefix needs ${PREFIX_BYTES}`,
    );
  }
  for (let i = 0; i < MAGIC.length; i++) {
    if (bytes[i] !== MAGIC[i]) {
      fail(
        "format",
        `not a kvrelay snapshot: magic ${hex(bytes.subarray(0, 8))}, expected ${hex(MAGIC)}`,
      );
    }
  }
  const dv = new DataView(bytes.buffer, bytes.byteOffset, PREFIX_BYTES);
  const versionMajor = dv.getUint16(8, true);
  const versionMinor = dv.getUint16(10, true);
  if (versionMajor !== VERSION_MAJOR) {
    fail(
      "version",
      `snapshot format version ${versionMajor}.${versionMinor} is not supported: this reader ` +
        `understands major version ${VERSION_MAJOR} only`,
    );
  }
  const flags = dv.getUint32(12, true);
  if ((flags & ~KNOWN_FLAGS) !== 0) {
    fail("format", `unknown flag bits 0x${(flags & ~KNOWN_FLAGS).toString(16)} in snapshot flags`);
  }
  const headerLength = dv.getUint32(16, true);
  if (headerLength < HEADER_FIXED_BYTES) {
    fail("bounds", `header length ${headerLength} is below the minimum ${HEADER_FIXED_BYTES}`);
  }
  if (headerLength > LIMITS.maxHeaderBytes) {
    fail("bounds", `header length ${headerLength} exceeds the limit ${LIMITS.maxHeaderBytes}`);
  }
  return { versionMajor, versionMinor, flags, headerLength, headerCrc: dv.getUint32(20, true) };
}

/** Options bounding what a reader accepts. */
export interface ReadLimits {
  /** Maximum total snapshot bytes (default DEFAULT_MAX_BYTES, capped at LIMITS.maxTotalBytes). */
  maxBytes?: number;
}

/**
 * Parses and validates the header: CRC first, then every field against LIMITS and against each
 * other, the chunk table against the table these parameters imply, and the total size against
 * `maxBytes`. Allocates only arrays sized by the (already bounded) header.
 * @param prefixAndHeader bytes [0, PREFIX_BYTES + header_length)
 * @returns the header and its layout
 * @throws SnapshotError checksum, bounds, format, too_large
 */
export function decodeHeader(
  prefixAndHeader: Uint8Array,
  limits: ReadLimits = {},
): { header: SnapshotHeader; layout: SnapshotLayout } {
  const pre = decodePrefix(prefixAndHeader);
  const need = PREFIX_BYTES + pre.headerLength;
  if (prefixAndHeader.length < need) {
    fail("bounds", `snapshot truncated: header needs ${need} bytes, got ${prefixAndHeader.length}`);
  }
  const body = prefixAndHeader.subarray(PREFIX_BYTES, need);
  const crc = headerCrc(prefixAndHeader.subarray(0, 20), body);
  if (crc !== pre.headerCrc) {
    fail(
      "checksum",
      `header checksum mismatch: stored crc32c 0x${pre.headerCrc.toString(16)}, computed 0x${
        crc.toString(16)
      }`,
    );
  }
  const dv = new DataView(body.buffer, body.byteOffset, body.byteLength);
  const u32 = (off: number) => dv.getUint32(off, true);
  const f64 = (off: number) => dv.getFloat64(off, true);
  const bounded = (v: number, min: number, max: number, what: string) => {
    if (v < min || v > max) fail("bounds", `${what} ${v} outside [${min}, ${max}]`);
    return v;
  };
  const numLayers = bounded(u32(68), 1, LIMITS.maxLayers, "num_layers");
  const numKvHeads = bounded(u32(72), 1, LIMITS.maxKvHeads, "num_kv_heads");
  const headDim = bounded(u32(76), 1, LIMITS.maxHeadDim, "head_dim");
  const dtypeCode = u32(80);
  if (dtypeCode >= DTYPE_NAMES.length) fail("format", `unknown cache dtype code ${dtypeCode}`);
  const encCode = u32(84);
  if (encCode >= ENCODING_NAMES.length) fail("format", `unknown encoding code ${encCode}`);
  const encoding = ENCODING_NAMES[encCode];
  const chunkTokens = bounded(u32(88), 1, LIMITS.maxChunkTokens, "chunk_tokens");
  const groupSize = u32(92);
  if (encoding === "q4") bounded(groupSize, 1, LIMITS.maxGroupSize, "group_size");
  else if (groupSize !== 0) fail("format", `group_size ${groupSize} must be 0 for ${encoding}`);
  const scaling = u32(96);
  if (scaling > 2) fail("format", `unknown rope scaling code ${scaling}`);
  const rope: SnapshotRope = {
    theta: f64(104),
    scaling: scaling as 0 | 1 | 2,
    factor: f64(112),
    lowFreqFactor: f64(120),
    highFreqFactor: f64(128),
    originalMaxPosition: u32(100),
  };
  for (const [k, v] of Object.entries(rope)) {
    if (!Number.isFinite(v)) fail("format", `rope ${k} is not finite (${v})`);
  }
  const positionOffset = u32(136);
  const nTokens = u32(140);
  const nPending = u32(144);
  const nChunks = u32(148);
  const keyIdLength = u32(152);
  if (nTokens > LIMITS.maxTokens || nPending > LIMITS.maxTokens - nTokens) {
    fail(
      "bounds",
      `token count ${nTokens} + pending ${nPending} exceeds the limit ${LIMITS.maxTokens}`,
    );
  }
  if (positionOffset + nTokens + nPending > 0xffffffff) {
    fail("bounds", `position offset ${positionOffset} + tokens overflows u32`);
  }
  if (nChunks !== Math.ceil(nTokens / chunkTokens)) {
    fail(
      "format",
      `chunk count ${nChunks} disagrees with ${nTokens} tokens in chunks of ${chunkTokens}`,
    );
  }
  const signed = (pre.flags & FLAG_SIGNED) !== 0;
  if (keyIdLength > LIMITS.maxKeyIdBytes) {
    fail("bounds", `key id length ${keyIdLength} exceeds ${LIMITS.maxKeyIdBytes}`);
  }
  if (signed !== (keyIdLength > 0)) {
    fail("format", `signed flag ${signed} disagrees with key id length ${keyIdLength}`);
  }
  const expectedLength = HEADER_FIXED_BYTES + keyIdLength + 4 * (nTokens + nPending) +
    CHUNK_TABLE_ROW_BYTES * nChunks +
    (pre.versionMinor >= PROVENANCE_MINOR ? PROVENANCE_BYTES : 0);
  // A newer minor version may append fields after the provenance block; this reader ignores them.
  if (
    pre.headerLength < expectedLength ||
    (pre.versionMinor <= VERSION_MINOR && pre.headerLength !== expectedLength)
  ) {
    fail(
      "format",
      `header length ${pre.headerLength} disagrees with its contents (${expectedLength} bytes)`,
    );
  }
  let p = HEADER_FIXED_BYTES;
  let keyId: string | null = null;
  if (signed) {
    try {
      keyId = new TextDecoder("utf-8", { fatal: true }).decode(body.subarray(p, p + keyIdLength));
    } catch {
      fail("format", "key id is not valid UTF-8");
    }
    p += keyIdLength;
  }
  const ids = new Uint32Array(nTokens + nPending);
  for (let i = 0; i < ids.length; i++, p += 4) ids[i] = u32(p);
  const geometry: SnapshotGeometry = {
    architecture: u32(64),
    numLayers,
    numKvHeads,
    headDim,
    rope,
  };
  const expected = expectedChunkTable(encoding, geometry, nTokens, chunkTokens, groupSize, signed);
  const chunks: ChunkEntry[] = [];
  for (let i = 0; i < nChunks; i++, p += CHUNK_TABLE_ROW_BYTES) {
    const off = dv.getBigUint64(p, true);
    const row: ChunkEntry = {
      offset: off > BigInt(LIMITS.maxTotalBytes) ? Infinity : Number(off),
      length: u32(p + 8),
      tokens: u32(p + 12),
    };
    const e = expected[i];
    if (row.offset !== e.offset) {
      fail(
        "format",
        `chunk table out of order: chunk ${i} at offset ${off}, expected ${e.offset}`,
      );
    }
    if (row.tokens !== e.tokens || row.length !== e.length) {
      fail(
        "format",
        `chunk table row ${i}: ${row.tokens} tokens/${row.length} bytes, expected ${e.tokens}/${e.length}`,
      );
    }
    if (row.length > LIMITS.maxChunkBytes) {
      fail("bounds", `chunk ${i} of ${row.length} bytes exceeds ${LIMITS.maxChunkBytes}`);
    }
    chunks.push(row);
  }
  let provenance: SnapshotProvenance | undefined;
  if (pre.versionMinor >= PROVENANCE_MINOR) {
    const flags = u32(p);
    if ((flags & ~PROVENANCE_MIGRATED) !== 0) {
      fail(
        "format",
        `unknown provenance flag bits 0x${(flags & ~PROVENANCE_MIGRATED).toString(16)}`,
      );
    }
    provenance = {
      migrated: (flags & PROVENANCE_MIGRATED) !== 0,
      sourceModelFingerprint: hex(body.subarray(p + 4, p + 36)),
      repairTokens: u32(p + 36),
    };
    if (provenance.repairTokens > nPending) {
      fail(
        "format",
        `provenance repair tokens ${provenance.repairTokens} exceed the ${nPending} pending tokens`,
      );
    }
  }
  const payloadStart = PREFIX_BYTES + pre.headerLength + (signed ? TAG_BYTES : 0);
  const last = chunks.at(-1);
  const totalBytes = payloadStart + (last ? last.offset + last.length : 0);
  const maxBytes = Math.min(limits.maxBytes ?? DEFAULT_MAX_BYTES, LIMITS.maxTotalBytes);
  if (totalBytes > maxBytes) {
    fail("too_large", `snapshot of ${totalBytes} bytes exceeds the maximum ${maxBytes}`);
  }
  const header: SnapshotHeader = {
    versionMajor: pre.versionMajor,
    versionMinor: pre.versionMinor,
    flags: pre.flags,
    modelFingerprint: hex(body.subarray(0, 32)),
    tokenizerFingerprint: hex(body.subarray(32, 64)),
    geometry,
    cacheDtype: DTYPE_NAMES[dtypeCode],
    encoding,
    chunkTokens,
    groupSize,
    positionOffset,
    tokenIds: ids.subarray(0, nTokens),
    pendingTokenIds: ids.subarray(nTokens),
    chunks,
    keyId,
    ...(provenance ? { provenance } : {}),
  };
  return { header, layout: { headerLength: pre.headerLength, payloadStart, totalBytes } };
}
