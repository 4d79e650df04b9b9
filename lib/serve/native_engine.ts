// The StepEngine of a native model with a paged KV pool: the scheduler's view of
// NativeModel.batchStep and KvPool (block counts, lengths, reset by truncate(0)), with native
// sampling in the step (a decode returns a token id, no vocabulary row reaches JavaScript), and
// bursts of decode steps in one call (NativeModel.batchDecodeSteps).
// Not the scheduler (scheduler.ts) nor the pool sizing (pool_size.ts).

import {
  EngineError,
  type KvPool,
  type NativeModel,
  type NativeSampler,
  type NativeSamplingOptions,
  type NativeSequence,
} from "../native/mod.ts";
import type { Scheduler, StepEngine, StepItem } from "./scheduler.ts";

/** A scheduler over native sequences that samples natively. */
export type NativeScheduler = Scheduler<NativeSequence, NativeSampler, NativeSamplingOptions>;

/**
 * Wraps a model and its pool for {@link Scheduler}.
 * @param model the model
 * @param pool a pool of that model; every scheduled sequence comes from it
 * @returns the engine
 */
export function nativeStepEngine(
  model: NativeModel,
  pool: KvPool,
): StepEngine<NativeSequence, NativeSampler, NativeSamplingOptions> {
  return {
    blockTokens: pool.blockTokens,
    blocksTotal: pool.blocksTotal,
    blocksFree: () => pool.blocksFree,
    blocksHeld: (s) => s.blocks,
    length: (s) => s.length,
    reset: (s) => s.truncate(0),
    step: (items: StepItem<NativeSequence, NativeSampler>[]) => model.batchStep(items),
    createSampler: (opts) => model.createSampler(opts),
    sampleRow: (sampler, logits, width, req) => sampler.sample(logits, width, req),
    isPoolExhausted: (e) => e instanceof EngineError && e.codeName === "POOL_EXHAUSTED",
    decodeSteps: (items: StepItem<NativeSequence, NativeSampler>[], steps: number) =>
      model.batchDecodeSteps(
        items.map((it) => ({ seq: it.seq, token: it.tokens[0], sample: it.sample! })),
        steps,
      ),
    truncate: (s, length) => s.truncate(length),
  };
}
