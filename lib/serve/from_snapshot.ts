// A generation continued from a KV snapshot (decode): admission (a queue slot, then the KV blocks
// of the tier's pool), verified import (header, signature, fingerprint before any KV is allocated)
// into a paged sequence of the tier's pool, or a migration from the tier whose model made it
// projected into one, then the pending tokens plus the continuation prefilled by the tier's
// scheduler and the usual Generation, stepped with every other request.
import type { GenerateOptions } from "../engine/mod.ts";
import { Lane } from "./lane.ts";
import { MigrationRefusedError } from "../migrate/mod.ts";
import type { NativeSequence } from "../native/mod.ts";
import { importSnapshot, type SnapshotHeader } from "../snapshot/mod.ts";
import { InputError } from "./errors.ts";
import { type CacheOutcome, Generation, withCacheTemperature } from "./generation.ts";
import { tierNameOfModel, untilAborted } from "./handoff.ts";
import type { RequestContext } from "./request.ts";
import { requireReady, type Runtime } from "./runtime.ts";
import { poolFullError, reservePoolBlocks } from "./pool_reserve.ts";
import { QueueFullError } from "./queue.ts";
import { type BlockReservation, SchedulerClosedError } from "./scheduler.ts";
import { admitSlot, stoppedError } from "./slot.ts";
import type { Tier } from "./tier.ts";

/**
 * Refuses a decode whose snapshot + continuation + max_tokens exceed the tier's max_context, or
 * that has no token at all.
 * @throws {InputError} naming `continuation` when it is what pushes the total over, else
 *   `max_tokens`
 */
function checkSnapshotContext(
  tier: Tier,
  snapshotTokens: number,
  continuationTokens: number,
  maxTokens: number,
): void {
  const limit = tier.config.max_context;
  if (snapshotTokens + continuationTokens === 0) {
    throw new InputError("snapshot holds no tokens and no continuation was given", "continuation");
  }
  if (snapshotTokens + continuationTokens + maxTokens <= limit) return;
  throw new InputError(
    `snapshot (${snapshotTokens} tokens) + continuation (${continuationTokens} tokens) + max_tokens (${maxTokens}) exceeds tier "${tier.name}"'s max_context ${limit}`,
    continuationTokens > 0 && snapshotTokens + maxTokens <= limit ? "continuation" : "max_tokens",
    "context_length_exceeded",
  );
}

/** A generation that continues from an imported snapshot. */
export interface SnapshotGenerationRequest {
  /** The tier that decodes. */
  tier: Tier;
  /** The tier whose model made the snapshot (default `tier`); another model → migration. */
  source?: Tier;
  /** Snapshot bytes or stream (verified before import). */
  input: Uint8Array | ReadableStream<Uint8Array>;
  /** The snapshot's header as the caller peeked it (peekStream/peekHeader): the context limit
   *  is checked against it before a slot is taken (the import checks the real one again). */
  header: SnapshotHeader;
  /** Token ids to append after the snapshot's tokens (continuation text). */
  continuationIds: number[];
  options: Omit<GenerateOptions, "signal">;
  /** Client signal, arrival, tenant. */
  ctx: RequestContext;
}

/**
 * Admits a generation on `tier`, imports the snapshot (the header is checked — CRC, signature
 * when keys are configured, model fingerprint — before any KV is allocated), prefills its pending
 * tokens plus the continuation, and returns it ready to decode. When the snapshot comes from
 * another tier's model (`source`), its KV is imported there, migrated into `tier` (projector,
 * gated) and the last `repair` tokens are recomputed by `tier` itself.
 * @param rt the runtime
 * @param req tier, source tier, snapshot, continuation, options
 * @returns the admitted generation; `promptIds` are every token in the sequence
 * @throws {SnapshotError} (foreign model, signature, size, malformed);
 *   {@link MigrationRefusedError}; {@link QueueFullError}; {@link InputError} when the
 *   result would exceed max_context; {@link UnavailableError} not ready, timeout, shutdown
 */
export async function startFromSnapshot(
  rt: Runtime,
  req: SnapshotGenerationRequest,
): Promise<Generation> {
  const startMs = performance.now();
  const { tier } = req;
  const source = req.source ?? tier;
  const migrating = source.model.fingerprint !== tier.model.fingerprint;
  requireReady(rt);
  const gate = migrating ? rt.migrator.gate(source, tier) : null;
  if (gate && !gate.ok) {
    throw new MigrationRefusedError(gate.code, `${source.name} → ${tier.name}: ${gate.reason}`);
  }
  const repairTokens = gate?.ok ? gate.repairTokens : 0;
  const maxTokens = req.options.maxTokens ?? tier.config.default_max_tokens;
  const { tokenIds, pendingTokenIds } = req.header;
  checkSnapshotContext(
    tier,
    tokenIds.length + pendingTokenIds.length,
    req.continuationIds.length,
    maxTokens,
  );
  const slot = await admitSlot(rt, tier, req.ctx);
  const { release } = slot;
  rt.metrics.activeSequences.add({ tier: tier.name }, 1);
  const batch = tier.batch;
  let src: NativeSequence | null = null;
  let seq: NativeSequence | null = null;
  let lane: Lane | null = null;
  let held: BlockReservation | null = null;
  // A streamed body is read while this request holds a slot: its deadline bounds the upload.
  const input = req.input instanceof Uint8Array ? req.input : untilAborted(
    req.input,
    slot.signal,
    () => stoppedError(rt, tier, req.ctx.client, "receiving the snapshot"),
  );
  try {
    // The KV lands in this tier's pool (imported as is, or projected): its blocks are admitted
    // first, as a prompt's are. The header was peeked and CRC-checked; the import checks it again.
    const kvTokens = tokenIds.length;
    held = await reservePoolBlocks(
      tier,
      migrating ? Math.max(0, kvTokens - repairTokens) : kvTokens,
      slot.signal,
    );
    if (held) slot.started();
    const imported = await importSnapshot(source.model, input, {
      verify: rt.verify,
      maxBytes: rt.config.server.max_snapshot_bytes,
      reserve: migrating ? 0 : maxTokens + req.continuationIds.length + 1,
      maxTokens: Math.max(source.config.max_context, tier.config.max_context) + 1,
      prefillPending: false,
      // Same model: straight into a paged sequence of this tier's pool. A migration imports into
      // a scratch sequence of the source model, read once by the projection and freed.
      createSequence: !migrating && batch ? (n) => batch.pool.createSequence(n) : undefined,
    });
    const ids = [...imported.tokenIds, ...req.continuationIds];
    let keep = imported.header.tokenIds.length;
    if (migrating) {
      src = imported.sequence;
      keep = Math.max(0, keep - repairTokens);
      const capacity = ids.length + maxTokens + 1;
      seq = batch
        ? batch.pool.createSequence(capacity)
        : tier.model.native.createSequence(capacity);
      if (keep > 0) await rt.migrator.projectInto(source, tier, src, keep, seq);
      src.free();
      src = null;
      rt.metrics.migrations.inc({ from: source.name, to: tier.name });
    } else seq = imported.sequence;
    held?.release();
    held = null;
    lane = Lane.adopt(tier, seq, slot.signal, slot.started);
    seq = null;
    checkSnapshotContext(tier, imported.tokenIds.length, req.continuationIds.length, maxTokens);
    let tail = ids.slice(keep);
    if (tail.length === 0) {
      // Everything is in the KV: recompute the last position for its logits.
      lane.seq.truncate(lane.seq.length - 1);
      tail = ids.slice(-1);
    }
    // The repair tail and the continuation: a prefill of the scheduler's steps (with the tokens
    // already in the KV as the sequence's history), then decodes with every other request.
    const reused = lane.seq.length;
    const logits = await lane.prefill(ids.slice(0, reused), tail);
    rt.metrics.reusedTokens.inc({ tier: tier.name }, reused);
    // A migration that carried no KV (the snapshot's tokens do not exceed the repair length) is
    // a full prefill on this tier: said so, with its reason, rather than called a migration.
    const cache: CacheOutcome = !migrating
      ? { source: "snapshot", reusedTokens: reused, logitTemperature: migratedTemperature(rt, req) }
      : keep === 0
      ? {
        source: "fallback",
        fromTier: source.name,
        reason: `the snapshot's ${kvTokens} KV tokens do not exceed the repair length`,
        reasonCode: "prompt_too_short",
        reusedTokens: reused,
      }
      : {
        source: "migrated",
        fromTier: source.name,
        reusedTokens: reused,
        logitTemperature: gate?.ok ? gate.temperature : 1,
      };
    return new Generation(
      rt,
      tier,
      ids,
      withCacheTemperature({ ...req.options, maxTokens }, cache),
      cache,
      lane,
      logits,
      release,
      { all: slot.signal, client: req.ctx.client },
      startMs,
    );
  } catch (e) {
    held?.release();
    src?.free();
    seq?.free();
    lane?.free();
    batch?.refresh();
    rt.metrics.activeSequences.add({ tier: tier.name }, -1);
    release();
    // A deadline, disconnect or shutdown while it waited for KV blocks or for its prefill.
    if (e instanceof SchedulerClosedError && slot.signal.aborted) {
      throw stoppedError(rt, tier, req.ctx.client, `continuing a snapshot on tier "${tier.name}"`);
    }
    const full = poolFullError(tier, e);
    if (full instanceof QueueFullError) rt.metrics.rejected.inc({ tier: tier.name });
    throw full;
  }
}

/**
 * The logit temperature of a snapshot that an earlier migration projected (its provenance names
 * the source model): decoding it samples as decoding right after that migration would.
 * @returns the projector's fitted temperature, or 1 (not migrated, or the pair is not served)
 */
function migratedTemperature(rt: Runtime, req: SnapshotGenerationRequest): number {
  const prov = req.header.provenance;
  if (!prov?.migrated) return 1;
  const name = tierNameOfModel(rt, prov.sourceModelFingerprint);
  const from = name === null ? undefined : rt.tiers.get(name);
  if (!from) return 1;
  const gate = rt.migrator.gate(from, req.tier);
  return gate.ok ? gate.temperature : 1;
}

/** Where a decode's KV came from, as a decode answer reports it. */
export interface DecodeOrigin {
  /** The tier whose model first computed the KV (null: a model no tier here serves). */
  sourceTier: string | null;
  /** The KV was projected from another model's, by this decode or an earlier /v1/migrate. */
  migrated: boolean;
  /** Why a handoff from another model carried no KV (stable code), else null. */
  reason: CacheOutcome["reasonCode"] | null;
}

/**
 * Where the KV of a decode came from: the snapshot's provenance (format 1.1, written by a
 * migration) when it has one, else the tier whose model made it, combined with what this decode
 * did itself (a migration, or a handoff that carried nothing).
 * @param rt the runtime (tier names of model fingerprints)
 * @param header the snapshot's header
 * @param source the tier whose model made the snapshot
 * @param cache the generation's cache outcome
 * @returns source tier, migrated, and why nothing was migrated
 */
export function decodeOrigin(
  rt: Runtime,
  header: SnapshotHeader,
  source: Tier,
  cache: CacheOutcome,
): DecodeOrigin {
  const prov = header.provenance;
  const sourceTier = prov ? tierNameOfModel(rt, prov.sourceModelFingerprint) : source.name;
  if (cache.source === "migrated") return { sourceTier, migrated: true, reason: null };
  if (cache.source === "fallback") {
    return { sourceTier, migrated: false, reason: cache.reasonCode ?? null };
  }
  if (!prov) return { sourceTier, migrated: false, reason: null };
  // A migration that kept no KV writes migrated = false with another model as the source.
  const foreign = prov.sourceModelFingerprint !== header.modelFingerprint;
  return {
    sourceTier,
    migrated: prov.migrated,
    reason: foreign && !prov.migrated ? "prompt_too_short" : null,
  };
}
