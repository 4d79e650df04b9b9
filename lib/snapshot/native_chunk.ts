// Binds a NativeSequence's native chunk codec (kvr_seq_export_chunk / kvr_seq_import_chunk: the
// backend encodes from and decodes into its own cache) to the KvSource / KvSink of the stream
// codec, turning native CHECKSUM / CORRUPT failures (CRC; index, scales, non-finite or
// overflowing values) into SnapshotError checksum / format.
// Not the codec (native/src/core/chunk_codec.cpp) nor the format (format.ts, chunk_frame.ts).

import { EngineError, type NativeSequence } from "../native/mod.ts";
import type { KvSink, KvSource } from "./chunk_frame.ts";
import { SnapshotError } from "./errors.ts";

const KVR_ERR_CORRUPT = -7;
const KVR_ERR_CHECKSUM = -9;

/**
 * A source encoding whole chunk frames natively from `seq`.
 * @param seq the source sequence
 * @returns a KvSource whose exportChunk is the backend's encoder (EngineError on failure)
 */
export function nativeSource(seq: NativeSequence): KvSource {
  return {
    exportChunk: (encoding, groupSize, index, start, tokens, frame) =>
      seq.exportChunkFrame(encoding, groupSize, index, start, tokens, frame),
  };
}

/**
 * A sink importing whole chunk frames natively into `seq`.
 * @param seq the destination sequence
 * @returns a KvSink whose importChunk throws SnapshotError checksum (CRC32C) or format (stored
 *   index/tokens, scales, mins) for a damaged frame
 */
export function nativeSink(seq: NativeSequence): KvSink {
  return {
    importChunk(encoding, groupSize, index, start, tokens, frame) {
      try {
        // The native import refuses (KVR_ERR_CORRUPT, before writing anything) a value that is
        // not finite in the frame or overflows the cache's dtype (f32 1e38 → f16 +Inf).
        seq.importChunkFrame(encoding, groupSize, index, start, tokens, frame);
      } catch (e) {
        if (e instanceof EngineError && e.code === KVR_ERR_CHECKSUM) {
          throw new SnapshotError("checksum", e.message, { cause: e });
        }
        if (e instanceof EngineError && e.code === KVR_ERR_CORRUPT) {
          throw new SnapshotError("format", e.message, { cause: e });
        }
        throw e;
      }
    },
  };
}
