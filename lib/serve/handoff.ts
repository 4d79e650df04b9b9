// Snapshot plumbing shared by prefill, migrate and decode: reading a snapshot (bounded stream or
// a store id), peeking at its header to find the tier that made it, guarding a stream by a
// deadline, and wrapping an export stream so its sequence and queue slot are freed when it ends —
// or when its client has not taken it by the request deadline.
// The byte format is lib/snapshot's; this file never decodes KV itself. No HTTP here.
import {
  decodeHeader,
  decodePrefix,
  defaultKvCodec,
  PREFIX_BYTES,
  receiveSnapshot,
  type SnapshotHeader,
} from "../snapshot/mod.ts";
import type { NativeSequence } from "../native/mod.ts";
import { hex, sha256 } from "../util/mod.ts";
import { InputError, NotFoundError, SnapshotMismatchError, TooLargeError } from "./errors.ts";
import { type BodyTier, bodyWithin, writeWithin } from "./deadline.ts";
import type { RequestContext } from "./request.ts";
import type { Runtime } from "./runtime.ts";
import type { Tier } from "./tier.ts";

/**
 * Store key of a snapshot id within its owner's namespace: a stored snapshot is bound to the
 * tenant that stored it, so another tenant's lookup of the same id finds nothing (a 404 that
 * does not confirm the id exists). The owner enters as a SHA-256 prefix (128 bits): any tenant
 * string gives a valid store key, and the key names no tenant.
 * @param owner the storing tenant (the API key's tenant, "anonymous" without keys)
 * @param id the snapshot id (a UUID)
 * @returns the store key
 */
export async function snapshotKey(owner: string, id: string): Promise<string> {
  const tag = hex(await sha256(new TextEncoder().encode(owner))).slice(0, 32);
  return `snap:${tag}:${id}`;
}

/**
 * Counts bytes flowing through a stream into the snapshot-bytes metric.
 * @param rt the runtime (metrics)
 * @param direction "in" (received) or "out" (sent)
 * @returns a pass-through transform
 */
export function countBytes(
  rt: Runtime,
  direction: "in" | "out",
): TransformStream<Uint8Array, Uint8Array> {
  return new TransformStream({
    transform(chunk, ctl) {
      rt.metrics.snapshotBytes.inc({ direction }, chunk.length);
      ctl.enqueue(chunk);
    },
  });
}

/**
 * Reads a whole snapshot body, refusing more than `maxBytes` (413).
 * @param stream the body
 * @param maxBytes the limit
 * @returns the bytes
 * @throws {TooLargeError} when larger; {@link InputError} when empty
 */
export async function readBounded(
  stream: ReadableStream<Uint8Array> | null,
  maxBytes: number,
): Promise<Uint8Array> {
  if (!stream) throw new InputError("snapshot body is empty", "body");
  const parts: Uint8Array[] = [];
  let n = 0;
  for await (const p of stream) {
    n += p.length;
    if (n > maxBytes) {
      throw new TooLargeError(`snapshot body exceeds ${maxBytes} bytes`, "body");
    }
    parts.push(p);
  }
  const out = new Uint8Array(n);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  if (n === 0) throw new InputError("snapshot body is empty", "body");
  return out;
}

/**
 * Loads a snapshot that `owner` stored, by id.
 * @param rt the runtime (store)
 * @param owner the requesting tenant: only its own snapshots are found
 * @param id the snapshot id
 * @returns its bytes
 * @throws {InputError} for a malformed id; {@link NotFoundError} when absent, expired or stored
 *   by another tenant (the same answer: nothing tells another tenant the id exists)
 */
export async function loadStored(rt: Runtime, owner: string, id: string): Promise<Uint8Array> {
  if (!/^[A-Za-z0-9-]{1,100}$/.test(id)) {
    throw new InputError(`snapshot_id ${JSON.stringify(id)} is malformed`, "snapshot_id");
  }
  const bytes = await rt.store.get(await snapshotKey(owner, id));
  if (!bytes) {
    throw new NotFoundError(`no snapshot "${id}" (unknown or expired)`, "snapshot_id");
  }
  rt.metrics.snapshotBytes.inc({ direction: "in" }, bytes.length);
  return bytes;
}

/**
 * Decodes a snapshot's header (CRC and limits checked; payload untouched).
 * @param bytes the whole snapshot (or at least its prefix and header)
 * @returns the header
 * @throws {SnapshotError} for a malformed header
 */
export function peekHeader(bytes: Uint8Array): SnapshotHeader {
  return decodeHeader(bytes).header;
}

/**
 * The tier whose model made a snapshot.
 * @param rt the runtime
 * @param header the snapshot header
 * @param prefer returned when its model made it (several tiers may serve one model)
 * @returns the tier
 * @throws {SnapshotMismatchError} when no served model has that fingerprint
 */
export function tierOfSnapshot(rt: Runtime, header: SnapshotHeader, prefer?: Tier): Tier {
  if (prefer && prefer.model.fingerprint.toLowerCase() === header.modelFingerprint) return prefer;
  for (const t of rt.tiers.values()) {
    if (t.model.fingerprint.toLowerCase() === header.modelFingerprint) return t;
  }
  throw new SnapshotMismatchError(
    `snapshot was made by model ${
      header.modelFingerprint.slice(0, 16)
    }…, which no tier here serves`,
  );
}

/**
 * The name of a tier serving the model with this fingerprint (the lowest such tier).
 * @param rt the runtime
 * @param fingerprint the model fingerprint (hex, any case)
 * @returns the tier name, or null when no tier here serves that model
 */
export function tierNameOfModel(rt: Runtime, fingerprint: string): string | null {
  const want = fingerprint.toLowerCase();
  for (const t of rt.tiers.values()) {
    if (t.model.fingerprint.toLowerCase() === want) return t.name;
  }
  return null;
}

/**
 * Wraps an export stream so `done` runs exactly once when it ends, fails or is cancelled — and
 * when `deadline` fires before the client has taken it all (see {@link writeWithin}): an unread
 * download must not hold its slot, sequence and KV past the request deadline.
 * @param stream the export stream (reads `seq` lazily)
 * @param done frees the sequence and releases the slot
 * @param deadline fires at the request deadline (the slot's timeout)
 * @param onExpire called once when the deadline aborts the download (metrics)
 * @returns the wrapped stream
 */
export function streamThenFree(
  stream: ReadableStream<Uint8Array>,
  done: () => void,
  deadline: AbortSignal,
  onExpire: () => void = () => {},
): ReadableStream<Uint8Array> {
  const reader = stream.getReader();
  let finished = false;
  const finish = () => {
    if (finished) return;
    finished = true;
    done();
  };
  return writeWithin(
    new ReadableStream<Uint8Array>({
      async pull(ctl) {
        try {
          const r = await reader.read();
          if (r.done) {
            finish();
            ctl.close();
          } else ctl.enqueue(r.value);
        } catch (e) {
          finish();
          ctl.error(e);
        }
      },
      async cancel(reason) {
        try {
          await reader.cancel(reason);
        } finally {
          finish();
        }
      },
    }, { highWaterMark: 0 }),
    deadline,
    { onExpire },
  );
}

/**
 * Frees a sequence (or the lane holding it) and releases a slot, keeping the active-sequences
 * gauge right.
 * @param rt the runtime
 * @param tier the tier
 * @param seq the sequence or lane (may be null)
 * @param release the slot release
 * @returns a function doing it once
 */
export function releaser(
  rt: Runtime,
  tier: Tier,
  seq: Pick<NativeSequence, "free"> | null,
  release: () => void,
): () => void {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    seq?.free();
    rt.metrics.activeSequences.add({ tier: tier.name }, -1);
    release();
  };
}

/**
 * Reads just enough of a snapshot stream to decode its header (CRC and limits checked), and
 * returns the header with a stream that replays every byte (header included) for the import.
 * @param stream the snapshot body
 * @returns the header and the replaying stream
 * @throws {SnapshotError} for a truncated or malformed prefix/header
 */
export async function peekStream(
  stream: ReadableStream<Uint8Array>,
): Promise<{ header: SnapshotHeader; stream: ReadableStream<Uint8Array> }> {
  const reader = stream.getReader();
  let buf = new Uint8Array(0);
  const fill = async (n: number) => {
    while (buf.length < n) {
      const r = await reader.read();
      if (r.done) return;
      const merged = new Uint8Array(buf.length + r.value.length);
      merged.set(buf);
      merged.set(r.value, buf.length);
      buf = merged;
    }
  };
  try {
    await fill(PREFIX_BYTES);
    const pre = decodePrefix(buf);
    await fill(PREFIX_BYTES + pre.headerLength);
    const { header } = decodeHeader(buf);
    const head = buf;
    const replay = new ReadableStream<Uint8Array>({
      start(ctl) {
        ctl.enqueue(head);
      },
      async pull(ctl) {
        const r = await reader.read();
        if (r.done) ctl.close();
        else ctl.enqueue(r.value);
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    });
    return { header, stream: replay };
  } catch (e) {
    await reader.cancel().catch(() => {});
    throw e;
  }
}

/**
 * Passes a stream through until `signal` aborts; then the stream errors with `reason()` (a read
 * waiting on a stalled sender fails at once) and the source is cancelled. Bounds how long an
 * import that holds a queue slot and a native sequence can wait on a slow or stalled client.
 * @param stream the source (e.g. a request body)
 * @param signal aborts the pass-through (request deadline, client gone, shutdown)
 * @param reason the error a pending or later read fails with
 * @returns the guarded stream
 */
export function untilAborted(
  stream: ReadableStream<Uint8Array>,
  signal: AbortSignal,
  reason: () => unknown,
): ReadableStream<Uint8Array> {
  const reader = stream.getReader();
  let ctl: ReadableStreamDefaultController<Uint8Array> | undefined;
  let finished = false;
  const onAbort = () => {
    if (finished) return;
    finished = true;
    try {
      ctl?.error(reason());
    } catch {
      // already closed: nothing is waiting on it (a throw here would escape as an uncaught error)
    }
    reader.cancel().catch(() => {});
  };
  const finish = () => {
    finished = true;
    signal.removeEventListener("abort", onAbort);
  };
  return new ReadableStream<Uint8Array>({
    start(c) {
      ctl = c;
      if (signal.aborted) onAbort();
      else signal.addEventListener("abort", onAbort, { once: true });
    },
    async pull(c) {
      let r: ReadableStreamReadResult<Uint8Array>;
      try {
        r = await reader.read();
      } catch (e) {
        if (finished) return;
        finish();
        c.error(e);
        return;
      }
      if (finished) return;
      if (r.done) {
        finish();
        c.close();
      } else c.enqueue(r.value);
    },
    cancel(why) {
      finish();
      return reader.cancel(why);
    },
  });
}

/** A snapshot upload received whole and checked; see {@link receiveUpload}. */
export interface Upload {
  header: SnapshotHeader;
  /** Bytes received. */
  bytes: number;
  /** A stream replaying the body for the import. */
  replay(): ReadableStream<Uint8Array>;
  /** Returns the upload's bytes to the process's body budget (idempotent); call after the
   *  import, however the request ends. */
  release(): void;
}

/**
 * Receives a snapshot body before it may take engine capacity: the prefix and header are checked
 * as they arrive (a hostile body is refused after a few bytes), the header's declared size is
 * checked against max_snapshot_bytes (413), every byte received — the header's first included —
 * is charged to the process's body budget as it arrives (429 when full), each chunk's CRC is
 * checked as it arrives, and the whole body must arrive within the body deadline (408).
 * A slow client therefore holds only the memory it has sent (bounded), never a tier slot.
 * @param rt the runtime (limits, budget, metrics)
 * @param body the raw body
 * @param ctx the request (arrival, client)
 * @param tier the tier the request names, when it names one (caps the body deadline)
 * @returns the received upload; release it after the import
 * @throws {SnapshotError} malformed/too large; {@link BusyError} budget full; {@link InputError}
 *   body_timeout; {@link UnavailableError} shutdown or client gone
 */
export async function receiveUpload(
  rt: Runtime,
  body: ReadableStream<Uint8Array>,
  ctx: Omit<RequestContext, "tenant">,
  tier?: BodyTier,
): Promise<Upload> {
  // Bytes are counted as they arrive (the metric shows an upload in progress).
  const guarded = bodyWithin(rt, body.pipeThrough(countBytes(rt, "in")), ctx, tier);
  try {
    const r = await receiveSnapshot(guarded.stream, {
      maxBytes: rt.config.server.max_snapshot_bytes,
      codec: defaultKvCodec(),
    });
    return { header: r.header, bytes: r.bytes, replay: r.replay, release: guarded.release };
  } catch (e) {
    guarded.release();
    throw e;
  } finally {
    guarded.done();
  }
}

/** When the first and the last chunk of a stream passed (epoch ms; null until they did). */
export interface StreamTiming {
  firstMs: number | null;
  lastMs: number | null;
}

/**
 * A pass-through that records when its first and last chunks pass. On the exporting side that is
 * when encoding started and finished (exports are encoded as they are pulled); on the importing
 * side when the import read its first and last bytes (imports write each chunk as it is read).
 * Both use the wall clock, so hosts with synchronized clocks can compare them.
 * @returns the transform and its (live) timing
 */
export function streamTimer(): {
  transform: TransformStream<Uint8Array, Uint8Array>;
  timing: StreamTiming;
} {
  const timing: StreamTiming = { firstMs: null, lastMs: null };
  const now = () => Math.round((performance.timeOrigin + performance.now()) * 10) / 10;
  return {
    timing,
    transform: new TransformStream({
      transform(chunk, ctl) {
        const t = now();
        timing.firstMs ??= t;
        timing.lastMs = t;
        ctl.enqueue(chunk);
      },
    }),
  };
}

/**
 * The `x-kvrelay-*-ms` header value of a stream timing: "first,last" epoch ms.
 * @param t the timing
 * @returns the value, or null when nothing passed
 */
export function timingHeader(t: StreamTiming): string | null {
  return t.firstMs === null ? null : `${t.firstMs},${t.lastMs}`;
}
