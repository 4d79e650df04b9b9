// Receiving a snapshot upload before anything imports it: reads the prefix and header as they
// arrive (magic, version, header CRC, limits, declared size — so a hostile body is refused after
// a few bytes, not after it was buffered), lets the caller look at the header, then reads and
// CRC-checks each chunk frame as it arrives, keeping the frames (no re-copy into one buffer).
// What the caller's input stream delivers is its to bound (lib/serve charges each byte as it
// arrives, the header's included).
// Signatures and KV values are checked by the import (decodeSnapshot) that replays the frames.
import { checkChunkFrame, type KvQuantCodec } from "./chunk_frame.ts";
import { SnapshotError } from "./errors.ts";
import {
  decodeHeader,
  decodePrefix,
  FLAG_SIGNED,
  PREFIX_BYTES,
  type SnapshotHeader,
  type SnapshotLayout,
  TAG_BYTES,
} from "./format.ts";
import { ByteReader } from "./stream.ts";

/** A snapshot body received whole and structurally checked. */
export interface ReceivedSnapshot {
  header: SnapshotHeader;
  layout: SnapshotLayout;
  /** Total bytes received (= layout.totalBytes). */
  bytes: number;
  /** A fresh stream replaying every received byte (for decodeSnapshot/importSnapshot). */
  replay(): ReadableStream<Uint8Array>;
}

/** Options of {@link receiveSnapshot}. */
export interface ReceiveOptions {
  /** Largest snapshot accepted (the header's declared size is checked against it). */
  maxBytes: number;
  /** Called once the header is checked, before any chunk byte is read: throw to refuse. */
  onHeader?(header: SnapshotHeader, layout: SnapshotLayout): void | Promise<void>;
  /** CRC32C implementation (native when given). */
  codec?: KvQuantCodec;
}

/**
 * Reads a snapshot stream completely, refusing it at the first malformed byte: prefix, header
 * (CRC, limits, declared size ≤ maxBytes), then each chunk frame's CRC and index as it arrives,
 * then that nothing follows the last chunk.
 * @param input the body
 * @param opts size limit, reservation hook, CRC codec
 * @returns the header and the received bytes
 * @throws {SnapshotError} for a truncated, malformed, oversized or trailing-bytes body; errors
 *   of the input stream and of `onHeader` propagate unchanged
 */
export async function receiveSnapshot(
  input: ReadableStream<Uint8Array>,
  opts: ReceiveOptions,
): Promise<ReceivedSnapshot> {
  const reader = new ByteReader(input);
  try {
    const prefix = (await reader.read(PREFIX_BYTES, "prefix")).slice();
    const pre = decodePrefix(prefix);
    const body = await reader.read(pre.headerLength, "header");
    const head = new Uint8Array(PREFIX_BYTES + pre.headerLength);
    head.set(prefix);
    head.set(body, PREFIX_BYTES);
    const { header, layout } = decodeHeader(head, { maxBytes: opts.maxBytes });
    await opts.onHeader?.(header, layout);
    const pieces: Uint8Array[] = [head];
    const signed = (header.flags & FLAG_SIGNED) !== 0;
    if (signed) pieces.push((await reader.read(TAG_BYTES, "header tag")).slice());
    for (let i = 0; i < header.chunks.length; i++) {
      const frame = (await reader.read(header.chunks[i].length, `chunk ${i}`)).slice();
      checkChunkFrame(frame, i, header.chunks[i].tokens, signed, opts.codec);
      pieces.push(frame);
    }
    if (!(await reader.atEnd())) {
      throw new SnapshotError(
        "format",
        `trailing bytes after the last chunk (snapshot is ${layout.totalBytes} bytes)`,
      );
    }
    return {
      header,
      layout,
      bytes: layout.totalBytes,
      replay() {
        let i = 0;
        return new ReadableStream<Uint8Array>({
          pull(ctl) {
            if (i < pieces.length) ctl.enqueue(pieces[i++]);
            else ctl.close();
          },
        });
      },
    };
  } catch (e) {
    await reader.cancel();
    throw e;
  }
}
