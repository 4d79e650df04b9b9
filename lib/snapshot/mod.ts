// lib/snapshot: the `.kvs` KV snapshot format (docs/snapshot-format.md) — header and chunk codec,
// CRC32C, HMAC-SHA256, streaming encode/decode, native q8/q4 codec, and engine export/import.
// Not snapshot storage (lib/store) nor projection across models (lib/migrate).

export { SnapshotError, type SnapshotErrorKind } from "./errors.ts";
export { crc32c, crc32cUpdate } from "./crc32c.ts";
export {
  type CacheDtype,
  type ChunkEntry,
  decodeHeader,
  decodePrefix,
  DEFAULT_CHUNK_TOKENS,
  DEFAULT_MAX_BYTES,
  DEFAULT_Q4_GROUP,
  LIMITS,
  MAGIC,
  PREFIX_BYTES,
  PROVENANCE_MINOR,
  type SnapshotEncoding,
  type SnapshotGeometry,
  type SnapshotHeader,
  type SnapshotLayout,
  type SnapshotProvenance,
  VERSION_MAJOR,
  VERSION_MINOR,
} from "./format.ts";
export { type KvQuantCodec, type KvSink, type KvSource } from "./chunk_frame.ts";
export { type HmacKey, type KeyRing } from "./hmac.ts";
export {
  type DecodeHandler,
  type DecodeOptions,
  decodeSnapshot,
  type EncodeOptions,
  encodeSnapshot,
  encodeSnapshotStream,
  type SnapshotMeta,
} from "./stream.ts";
export { NativeKvCodec } from "./native_codec.ts";
export { checkKvValues, KV_MAX_ABS, type KvBlockPlace } from "./finite.ts";
export { type ReceivedSnapshot, type ReceiveOptions, receiveSnapshot } from "./receive.ts";
export { nativeSink, nativeSource } from "./native_chunk.ts";
export {
  checkCompatible,
  defaultKvCodec,
  type ExportOptions,
  exportSnapshot,
  exportSnapshotStream,
  geometryOf,
  type ImportedSnapshot,
  type ImportOptions,
  importSnapshot,
  type PromptSnapshotOptions,
  snapshotPrompt,
} from "./engine.ts";
