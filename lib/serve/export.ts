// Snapshots a serving core produces: a prompt prefilled on a tier (in its scheduler's batched
// steps) and exported (prefill), a snapshot moved into another tier's model (migrate), and keeping
// an export in the shared store.
// Each holds a tier slot and a native sequence until its export stream ends or is cancelled, or
// until the request deadline passes with the stream not yet taken by its client.
// Routes, media types and peers are functions/'s.
import { MigrationRefusedError } from "../migrate/mod.ts";
import type { NativeSequence } from "../native/mod.ts";
import { exportSnapshotStream, importSnapshot } from "../snapshot/mod.ts";
import { prefillWithCache, type PrefixCache, StoreError } from "../store/mod.ts";
import { InputError } from "./errors.ts";
import {
  countBytes,
  peekHeader,
  releaser,
  snapshotKey,
  streamThenFree,
  tierOfSnapshot,
  type Upload,
} from "./handoff.ts";
import type { RequestContext } from "./request.ts";
import { requireReady, requireTier, type Runtime } from "./runtime.ts";
import { Lane } from "./lane.ts";
import { type BlockReservation, SchedulerClosedError } from "./scheduler.ts";
import { admitSlot, stoppedError } from "./slot.ts";
import type { Tier } from "./tier.ts";

/**
 * Prefills all of `ids` but the last on `tier` (reusing its prefix cache) and exports the KV as a
 * snapshot stream whose last token rides as pending (the importer computes the next-token logits
 * itself). The slot and sequence are released when the stream ends or is cancelled.
 * @param rt the runtime
 * @param tier the tier
 * @param ids prompt token ids (≥ 1)
 * @param param the prompt's request field, blamed when it reaches max_context
 * @param ctx the request (client signal, arrival, tenant)
 * @returns the snapshot stream (signed when a key is configured)
 * @throws {InputError} context_length_exceeded; {@link QueueFullError};
 *   {@link UnavailableError}
 */
export async function prefillSnapshot(
  rt: Runtime,
  tier: Tier,
  ids: number[],
  param: string,
  ctx: RequestContext,
): Promise<ReadableStream<Uint8Array>> {
  if (ids.length >= tier.config.max_context) {
    throw new InputError(
      `prompt (${ids.length} tokens) reaches max_context ${tier.config.max_context}`,
      param,
      "context_length_exceeded",
    );
  }
  const { release, timeout, signal, started } = await admitSlot(rt, tier, ctx);
  rt.metrics.activeSequences.add({ tier: tier.name }, 1);
  let done = releaser(rt, tier, null, release);
  const kv = ids.slice(0, -1);
  const prefix = tier.prefix?.forTenant(ctx.tenant);
  try {
    // A paged sequence of the tier's pool whose prefill runs in the scheduler's batched steps
    // (a sequence of its own on a tier without batching); attached but idle while it is exported.
    const lane = Lane.create(tier, Math.max(1, kv.length), signal, started);
    done = releaser(rt, tier, lane, release);
    if (kv.length > 0) {
      if (prefix) await cachedPrefill(rt, tier, prefix, lane, kv);
      else await lane.prefill([], kv);
    }
    started(); // a one-token prompt steps nothing here: its export is what it came for
    return streamThenFree(
      exportSnapshotStream(tier.model, lane.seq, {
        tokens: kv,
        pending: ids.slice(-1),
        encoding: tier.encoding,
        sign: rt.sign,
      }),
      done,
      timeout,
      () => rt.metrics.writeTimeouts.inc({ body: "snapshot" }),
    ).pipeThrough(countBytes(rt, "out"));
  } catch (e) {
    done();
    // A deadline, disconnect or shutdown while the prompt waited in the scheduler.
    if (e instanceof SchedulerClosedError && signal.aborted) {
      throw stoppedError(rt, tier, ctx.client, `prefilling on tier "${tier.name}"`);
    }
    throw e;
  }
}

/** Prefill through the tenant's prefix cache; the cache is optional, so a store failure
 *  degrades to a full prefill (counted as store_degraded), never to an error. */
async function cachedPrefill(
  rt: Runtime,
  tier: Tier,
  prefix: PrefixCache,
  lane: Lane,
  kv: number[],
): Promise<void> {
  try {
    const r = await prefillWithCache(
      prefix,
      lane.seq,
      kv,
      (reused) => lane.prefill(kv.slice(0, reused), kv.slice(reused)),
    );
    if (r.reusedTokens > 0) {
      rt.metrics.prefixHits.inc({ tier: tier.name });
      rt.metrics.reusedTokens.inc({ tier: tier.name }, r.reusedTokens);
    } else if (kv.length > prefix.chunkTokens) {
      rt.metrics.prefixMisses.inc({ tier: tier.name });
    }
  } catch (e) {
    if (!(e instanceof StoreError)) throw e;
    rt.metrics.errors.inc({ type: "store_degraded" });
    console.warn(`kvrelay: prefix cache of tier "${tier.name}" unavailable, full prefill: ${e}`);
    // The cache may have imported chunks or prefilled before failing: start over.
    lane.reset();
    await lane.prefill([], kv);
  }
}

/** A snapshot moved into another tier's model; see {@link migrateSnapshot}. */
export interface MigratedSnapshot {
  /** The target snapshot's bytes (ends or is cancelled to free the slot). */
  stream: ReadableStream<Uint8Array>;
  /** The tier whose model made the input. */
  source: Tier;
  /** The tier the output is for. */
  target: Tier;
  /** Positions whose KV was carried over. */
  migratedTokens: number;
  /** Tokens the target recomputes on import (pending in the output). */
  repairTokens: number;
  /** Why a migration to another model carried no KV (migratedTokens 0), as a stable code; null
   *  when some was, or for a same-model copy. */
  emptyReason: MigrationEmptyReason | null;
}

/** Why a handoff carried no KV though it was allowed: the snapshot's KV tokens do not exceed the
 *  projector's repair length, so the target recomputes all of them. */
export type MigrationEmptyReason = "prompt_too_short";

/**
 * Turns a snapshot of one tier's model into a snapshot of `targetName`'s model: an exact copy
 * for the same model, else through the configured projector when its quality gate allows. The
 * last repair tokens leave the KV and ride as pending tokens.
 * @param rt the runtime
 * @param input the input snapshot: stored bytes, or a received upload (header + replay)
 * @param targetName the target tier's name
 * @param targetParam the request field naming the target (quoted in a 404)
 * @param ctx the request (client signal, arrival)
 * @returns the output stream and what was carried over
 * @throws {SnapshotError}; {@link SnapshotMismatchError}; {@link MigrationRefusedError};
 *   {@link NotFoundError} unknown target; {@link QueueFullError}; {@link UnavailableError}
 */
export async function migrateSnapshot(
  rt: Runtime,
  input: Uint8Array | Pick<Upload, "header" | "replay">,
  targetName: string,
  targetParam: string,
  ctx: RequestContext,
): Promise<MigratedSnapshot> {
  requireReady(rt);
  const target = requireTier(rt, targetName, targetParam);
  const header = input instanceof Uint8Array ? peekHeader(input) : input.header;
  const source = tierOfSnapshot(rt, header);
  const gate = rt.migrator.gate(source, target);
  if (!gate.ok) {
    throw new MigrationRefusedError(gate.code, `${source.name} → ${target.name}: ${gate.reason}`);
  }
  const slot = await admitSlot(rt, target, ctx);
  const { timeout } = slot;
  rt.metrics.activeSequences.add({ tier: target.name }, 1);
  let src: NativeSequence | null = null;
  let tgt: NativeSequence | null = null;
  let held: BlockReservation | null = null;
  const release = () => {
    held?.release();
    held = null;
    slot.release();
  };
  let done = releaser(rt, target, null, release);
  try {
    // On a tier that batches, the copy is a sequence of its own outside the pool: blocks for its
    // KV are held back from the pool until the stream ends, so migrations count against the
    // tier's KV budget as prompts do and wait (under the deadline) when it is spent.
    const batch = target.batch;
    if (batch) {
      const blocks = Math.ceil(Math.max(1, header.tokenIds.length) / batch.pool.blockTokens);
      held = await batch.scheduler.reserveBlocks(
        Math.min(blocks, batch.pool.blocksTotal),
        slot.signal,
      )
        .catch((e) => {
          throw e instanceof SchedulerClosedError && slot.signal.aborted
            ? stoppedError(rt, target, ctx.client, `waiting for KV blocks on tier "${target.name}"`)
            : e;
        });
    }
    slot.started();
    const imported = await importSnapshot(
      source.model,
      input instanceof Uint8Array ? input : input.replay(),
      {
        verify: rt.verify,
        maxBytes: rt.config.server.max_snapshot_bytes,
        reserve: 0,
        maxTokens: source.config.max_context,
        prefillPending: false,
      },
    );
    src = imported.sequence;
    const kvTokens = imported.header.tokenIds.length;
    const same = source.model.fingerprint === target.model.fingerprint;
    const keep = same ? kvTokens : Math.max(0, kvTokens - gate.repairTokens);
    tgt = target.model.native.createSequence(Math.max(1, keep));
    done = releaser(rt, target, tgt, release);
    if (keep > 0) await rt.migrator.projectInto(source, target, src, keep, tgt);
    src.free();
    src = null;
    if (!same) rt.metrics.migrations.inc({ from: source.name, to: target.name });
    const ids = imported.tokenIds;
    // Provenance survives a copy as it was; a projection records where the KV came from, so a
    // later decode (on any function) can say so.
    const origin = header.provenance?.sourceModelFingerprint ?? source.model.fingerprint;
    const provenance = same ? header.provenance : {
      migrated: keep > 0,
      sourceModelFingerprint: origin,
      repairTokens: ids.length - keep,
    };
    const stream = streamThenFree(
      exportSnapshotStream(target.model, tgt, {
        tokens: ids.slice(0, keep),
        pending: ids.slice(keep),
        encoding: target.encoding,
        sign: rt.sign,
        provenance,
      }),
      done,
      timeout,
      () => rt.metrics.writeTimeouts.inc({ body: "snapshot" }),
    ).pipeThrough(countBytes(rt, "out"));
    return {
      stream,
      source,
      target,
      migratedTokens: keep,
      repairTokens: ids.length - keep,
      emptyReason: !same && keep === 0 ? "prompt_too_short" : null,
    };
  } catch (e) {
    src?.free();
    done();
    throw e;
  }
}

/**
 * Reads an export stream to its end and keeps it in the shared store under a fresh id, in the
 * namespace of `owner` (only that tenant finds it: {@link loadStored}).
 * @param rt the runtime (store, TTL)
 * @param owner the storing tenant
 * @param stream the snapshot stream
 * @returns the id and the byte count
 * @throws {StoreError} when the store refuses or is unreachable
 */
export async function storeSnapshot(
  rt: Runtime,
  owner: string,
  stream: ReadableStream<Uint8Array>,
): Promise<{ id: string; bytes: number }> {
  const bytes = new Uint8Array(await new Response(stream).arrayBuffer());
  const id = crypto.randomUUID();
  await rt.store.put(
    await snapshotKey(owner, id),
    bytes,
    rt.config.store.ttl_ms ? { ttlMs: rt.config.store.ttl_ms } : {},
  );
  return { id, bytes: bytes.length };
}
