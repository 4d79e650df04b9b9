// The StepEngine of a native model with a paged KV pool: the scheduler's view of
// NativeModel.batchStep and KvPool (block counts, lengths, reset by truncate(0)), with native
// sampling in the step (a decode returns a token id, no vocabulary row reaches JavaScript), and
// bursts of decode steps in one call (NativeModel.batchDecodeSteps). A row whose draw found no
// finite logit comes back as the domain error NonFiniteLogitsError, for that request only.
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
    step: async (items: StepItem<NativeSequence, NativeSampler>[]) =>
      domainResults(await model.batchStep(items)),
    createSampler: (opts) => model.createSampler(opts),
    sampleRow: (sampler, logits, width, req) => {
      try {
        return sampler.sample(logits, width, req);
      } catch (e) {
        throw domainError(e);
      }
    },
    isPoolExhausted: (e) => e instanceof EngineError && e.codeName === "POOL_EXHAUSTED",
    decodeSteps: async (items: StepItem<NativeSequence, NativeSampler>[], steps: number) =>
      domainResults(
        await model.batchDecodeSteps(
          items.map((it) => ({ seq: it.seq, token: it.tokens[0], sample: it.sample! })),
          steps,
        ),
      ),
    truncate: (s, length) => s.truncate(length),
  };
}
