// The StepEngine of a native model with a paged KV pool: the scheduler's view of
// NativeModel.batchStep and KvPool (block counts, lengths, reset by truncate(0)), with native
// sampling in the step (a decode returns a token id, no vocabulary row reaches JavaScript), and
// bursts of decode steps in one call (NativeModel.batchDecodeSteps). A row whose draw found no
// finite logit comes back as the domain error NonFiniteLogitsError, for that request only. The
// prefix cache's idle blocks count as free and are evicted when a step needs them.
// Not the scheduler (scheduler.ts) nor the pool sizing (pool_size.ts).

import {
  EngineError,
  type KvPool,
  type NativeModel,
  type NativeSampler,
  type NativeSamplingOptions,
  type NativeSequence,
  NoFiniteLogitError,
} from "../native/mod.ts";
import type { BlockCache } from "./block_cache.ts";
import { NonFiniteLogitsError } from "./errors.ts";
import type { Scheduler, StepEngine, StepItem } from "./scheduler.ts";

/**
 * The serving core's error for a logits row without a finite value, from the native sampler
 * (NoFiniteLogitError); anything else unchanged.
 * @param e a thrown or returned error
 * @returns a {@link NonFiniteLogitsError}, or `e`
 */
export function domainError<E>(e: E): E | NonFiniteLogitsError {
  if (!(e instanceof NoFiniteLogitError)) return e;
  return new NonFiniteLogitsError(
    `the model's logits at this step hold no finite value (${
      e.message.replace(/^.*?: (sampling: |argmax: )?/, "")
    }): the KV cache or the model's weights hold values that overflow`,
  );
}

// Per-item results with each failed draw as its domain error (in place: one array per step).
function domainResults<R>(out: R[]): R[] {
  for (let i = 0; i < out.length; i++) out[i] = domainError(out[i]) as R;
  return out;
}

/** A scheduler over native sequences that samples natively. */
export type NativeScheduler = Scheduler<NativeSequence, NativeSampler, NativeSamplingOptions>;

/** What the engine shares with the serving core around a pool (tier.batch). */
export interface PoolSharing {
  /** the prefix cache inside the pool: its idle blocks count as free and are evicted on demand */
  cache?: BlockCache;
  /** sequences whose next write copies a shared partial last block (one block more needed) */
  sharedTail?: WeakSet<NativeSequence>;
  /** blocks held back for KV written outside the steps (imports, projections): a step leaves
   *  that many free, evicting cached blocks for them too */
  reserved?: () => number;
}

/**
 * Wraps a model and its pool for {@link Scheduler}. Blocks the prefix cache holds for no live
 * sequence count as free: a step short of free blocks evicts them first (least recently used),
 * so the cache never makes admission refuse or preempt.
 * @param model the model
 * @param pool a pool of that model; every scheduled sequence comes from it
 * @param sharing the tier's prefix cache and shared-tail set
 * @returns the engine
 */
export function nativeStepEngine(
  model: NativeModel,
  pool: KvPool,
  sharing: PoolSharing = {},
): StepEngine<NativeSequence, NativeSampler, NativeSamplingOptions> {
  const { cache, sharedTail, reserved } = sharing;
  const bt = pool.blockTokens;
  const held = (s: NativeSequence) => s.blocks - (sharedTail?.has(s) ? 1 : 0);
  // Frees enough cached blocks for `tokens` more positions of each item's sequence.
  const makeRoom = (
    items: StepItem<NativeSequence, NativeSampler>[],
    tokens: (i: number) => number,
  ) => {
    if (!cache || cache.evictable === 0) return;
    let need = 0;
    items.forEach((it, i) => {
      need += Math.max(0, Math.ceil((it.seq.length + tokens(i)) / bt) - held(it.seq));
    });
    const short = need + (reserved?.() ?? 0) - pool.blocksFree;
    if (short > 0) cache.evict(Math.min(short, cache.evictable));
  };
  const wrote = (items: StepItem<NativeSequence, NativeSampler>[]) => {
    if (sharedTail) { for (const it of items) sharedTail.delete(it.seq); }
  };
  return {
    blockTokens: bt,
    blocksTotal: pool.blocksTotal,
    blocksFree: () => pool.blocksFree + (cache?.evictable ?? 0),
    makeFree: (blocks) => {
      const short = blocks - pool.blocksFree;
      if (cache && short > 0) cache.evict(Math.min(short, cache.evictable));
    },
    blocksHeld: held,
    length: (s) => s.length,
    reset: (s) => {
      sharedTail?.delete(s);
      s.truncate(0);
    },
    step: async (items: StepItem<NativeSequence, NativeSampler>[]) => {
      makeRoom(items, (i) => items[i].tokens.length);
      const out = domainResults(await model.batchStep(items));
      wrote(items);
      return out;
    },
    createSampler: (opts) => model.createSampler(opts),
    sampleRow: (sampler, logits, width, req) => {
      try {
        return sampler.sample(logits, width, req);
      } catch (e) {
        throw domainError(e);
      }
    },
    isPoolExhausted: (e) => e instanceof EngineError && e.codeName === "POOL_EXHAUSTED",
    decodeSteps: async (items: StepItem<NativeSequence, NativeSampler>[], steps: number) => {
      makeRoom(items, () => steps);
      const out = domainResults(
        await model.batchDecodeSteps(
          items.map((it) => ({ seq: it.seq, token: it.tokens[0], sample: it.sample! })),
          steps,
        ),
      );
      wrote(items);
      return out;
    },
    truncate: (s, length) => s.truncate(length),
  };
}
