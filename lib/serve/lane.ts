// A generation's engine handle: its native sequence and how its prefill and decode run — through
// the tier's continuous-batching scheduler (a paged sequence from the tier's KV pool, stepped with
// the other requests, whether it starts empty or holds imported or projected KV), or directly on a
// sequence of its own (only on a tier configured without batching).
// Not the scheduler (scheduler.ts) nor the generation's decode loop (generation.ts).

import type { DecodeTarget } from "../engine/mod.ts";
import type { NativeSampler, NativeSamplingOptions, NativeSequence } from "../native/mod.ts";
import type { BlockLease } from "./block_cache.ts";
import { reservePoolBlocks } from "./pool_reserve.ts";
import {
  type BlockReservation,
  type ScheduledSequence,
  SchedulerClosedError,
} from "./scheduler.ts";
import type { Tier } from "./tier.ts";

/** The sequence of one generation and the way its tokens are computed. */
export class Lane {
  /** The native sequence (KV imports and migration write into it directly). */
  readonly seq: NativeSequence;
  readonly #tier: Tier | null;
  readonly #signal: AbortSignal | undefined;
  /** the request got capacity: its first row stepped or its blocks granted (once) */
  readonly #onStart: (() => void) | undefined;
  #handle: ScheduledSequence<NativeSequence, NativeSampler, NativeSamplingOptions> | null = null;
  #freed = false;
  /** prefix-cache blocks the sequence holds through the tier's block cache (released on free) */
  #lease: BlockLease | null = null;

  /**
   * @param seq the sequence (owned by the lane from now on)
   * @param tier the tier whose scheduler steps it, or null to run it directly
   * @param signal aborting it during a prefill leaves the scheduler (the waiting work rejects
   *   with SchedulerClosedError), so a request's deadline also bounds its wait for KV blocks;
   *   decodes are stopped by the decode loop between tokens instead
   * @param onStart called when the request gets capacity on a batching tier: its first row is
   *   stepped, or blocks it reserved are granted (the admission ticket's start)
   */
  private constructor(
    seq: NativeSequence,
    tier: Tier | null,
    signal?: AbortSignal,
    onStart?: () => void,
  ) {
    this.seq = seq;
    this.#tier = tier?.batch ? tier : null;
    this.#signal = signal;
    this.#onStart = onStart;
  }

  /**
   * A lane for a new generation on `tier`: a paged sequence scheduled with the others when the
   * tier batches, else a sequence of its own.
   * @param tier the tier
   * @param capacity most tokens the sequence may hold
   * @param signal the request's signal (deadline, disconnect, shutdown)
   * @param onStart see the constructor (the request's Slot.started)
   * @returns the lane
   * @throws RangeError/EngineError from sequence creation
   */
  static create(
    tier: Tier,
    capacity: number,
    signal?: AbortSignal,
    onStart?: () => void,
  ): Lane {
    const seq = tier.batch
      ? tier.batch.pool.createSequence(capacity)
      : tier.model.native.createSequence(capacity);
    return new Lane(seq, tier, signal, onStart);
  }

  /**
   * A lane over a sequence that already holds KV (a snapshot imported, or a projection written,
   * into it): on a tier that batches, `seq` must be a paged sequence of the tier's pool, and its
   * first {@link prefill} attaches it to the scheduler with the tokens it holds as history, so
   * its repair tail and decodes are stepped with every other request. On a tier without batching
   * it runs directly.
   * @param tier the tier that decodes it
   * @param seq the sequence (owned by the lane from now on)
   * @param signal the request's signal (see the constructor)
   * @param onStart see the constructor (the request's Slot.started)
   * @returns the lane
   */
  static adopt(
    tier: Tier,
    seq: NativeSequence,
    signal?: AbortSignal,
    onStart?: () => void,
  ): Lane {
    return new Lane(seq, tier, signal, onStart);
  }

  /**
   * A lane on the same tier whose sequence starts with this one's cache (a forked choice of the
   * same prompt), attached to the scheduler with `known` as its history, so a preemption
   * recomputes it like any prefilled sequence. On a paged tier the new sequence adopts this one's
   * blocks (no KV copied; the partial last block is copied by whichever side writes into it
   * first); a tier without a pool copies the KV layer by layer, bit-exact in the cache's dtype.
   * Call it while this lane has no prefill or decode in flight. Forking never waits for the
   * scheduler.
   * @param known the token ids this lane's sequence holds (its length)
   * @returns the new lane, owning its sequence
   * @throws RangeError when `known` disagrees with `src`'s length; EngineError from the copy
   */
  fork(known: readonly number[]): Lane {
    const src = this.seq;
    if (known.length !== src.length) {
      throw new RangeError(`fork(): known has ${known.length} tokens, the sequence ${src.length}`);
    }
    const seq = this.#tier
      ? this.#tier.batch!.pool.createSequence(src.capacity)
      : src.model.createSequence(src.capacity);
    const lane = new Lane(seq, this.#tier, this.#signal);
    try {
      if (this.#tier) {
        const batch = this.#tier.batch!;
        seq.adopt(src.blockTable(), known.length);
        if (this.#lease) {
          batch.cache.retain(this.#lease);
          lane.#lease = this.#lease;
        }
        if (known.length % batch.pool.blockTokens !== 0) {
          batch.sharedTail.add(src);
          batch.sharedTail.add(seq);
        }
        lane.#handle = batch.scheduler.attach(seq, known);
        return lane;
      }
      for (let layer = 0; layer < src.model.config.numLayers; layer++) {
        const { k, v } = src.readKv(layer, 0, known.length);
        seq.writeKv(layer, 0, known.length, k, v);
      }
      seq.setLength(known.length);
      return lane;
    } catch (e) {
      lane.free();
      throw e;
    }
  }

  /**
   * Appends `rest` after the tokens already in the sequence (`known`, e.g. imported from a
   * prefix cache or migrated: what a preemption would recompute) and returns the last logits.
   * @param known the token ids the sequence holds now
   * @param rest the token ids to append (at least one)
   * @returns (vocab) logits after the last token
   * @throws as NativeSequence.prefill or Scheduler works (SchedulerClosedError on shutdown)
   */
  async prefill(known: readonly number[], rest: number[]): Promise<Float32Array> {
    if (!this.#tier) return await this.seq.prefill(rest);
    const signal = this.#signal;
    if (signal?.aborted) throw new SchedulerClosedError("the request was stopped");
    const h = this.#handle ??= this.#tier.batch!.scheduler.attach(this.seq, known, this.#onStart);
    const stop = () => h.detach();
    signal?.addEventListener("abort", stop, { once: true });
    try {
      return await h.prefill(rest);
    } finally {
      signal?.removeEventListener("abort", stop);
    }
  }

  /**
   * Holds back the pool blocks that `tokens` positions written into this lane's sequence outside
   * the steps (a projection) will take, waiting under the lane's signal as a prompt does.
   * @param tokens positions to be written
   * @returns the reservation to release once written (or on failure); null without batching
   * @throws SchedulerClosedError when stopped or on shutdown
   */
  async reserveBlocks(tokens: number): Promise<BlockReservation | null> {
    if (!this.#tier) return null;
    const held = await reservePoolBlocks(this.#tier, tokens, this.#signal);
    if (held) this.#onStart?.();
    return held;
  }

  /**
   * Records the prefix-cache blocks this lane's sequence holds through its tier's block cache
   * (adopted on a hit or inserted after the prefill); they are released when the lane is freed.
   * @param lease what the tier's BlockCache returned (replaces an earlier one)
   */
  setLease(lease: BlockLease): void {
    this.#lease = lease;
  }

  /** Empties the sequence (its blocks go back) and leaves the scheduler, for a fresh prefill. */
  reset(): void {
    this.#handle?.detach();
    this.#handle = null;
    if (this.seq.length > 0) this.seq.truncate(0);
    if (this.#lease) this.#tier?.batch?.cache.release(this.#lease);
    this.#lease = null;
  }

  /** What the decode loop drives: the scheduled handle, or the sequence itself. */
  get target(): DecodeTarget {
    return this.#handle ?? this.seq;
  }

  /** Leaves the scheduler and frees the sequence (its blocks return at once, or when the step
   *  it is part of settles). Idempotent. */
  free(): void {
    if (this.#freed) return;
    this.#freed = true;
    this.#handle?.detach();
    this.#handle = null;
    this.seq.free();
    if (this.#lease) this.#tier?.batch?.cache.release(this.#lease);
    this.#lease = null;
    this.#tier?.batch?.refresh();
  }
}
