// Per-request logit processing options (logit_bias, repetition/presence/frequency penalties,
// logprobs) and the shape of a step's log-probabilities. The processing itself is the native
// sampler's (kvr_sampler_set_*, lib/native/sampler.ts); its TypeScript oracle is
// tests/reference/logits.ts.

/** Logit processing and log-probability options of a generation. */
export interface LogitOptions {
  /** Token id → bias added to its logit (OpenAI: −100..100; −100 bans, 100 forces). */
  logitBias?: ReadonlyMap<number, number>;
  /** Subtracted once from the logit of every token generated at least once (−2..2). */
  presencePenalty?: number;
  /** Subtracted per occurrence from the logit of every generated token (−2..2). */
  frequencyPenalty?: number;
  /** Report the chosen token's log-probability and this many top alternatives (0..20). */
  logprobs?: number;
  /** transformers'/vLLM's repetition penalty over prompt and generated tokens (> 0; 1 = off). */
  repetitionPenalty?: number;
}

/**
 * Checks a repetition penalty.
 * @param p the value (undefined = off)
 * @returns p, or 1 when undefined
 * @throws {RangeError} unless p is a finite number > 0
 */
export function validRepetitionPenalty(p: number | undefined): number {
  if (p === undefined) return 1;
  if (typeof p !== "number" || !Number.isFinite(p) || !(p > 0)) {
    throw new RangeError(`repetitionPenalty must be a finite number > 0, got ${p}`);
  }
  return p;
}

/** A token with its log-probability. */
export interface TokenLogprob {
  id: number;
  logprob: number;
}

/** The chosen token's log-probability and the top alternatives (most likely first). */
export interface StepLogprobs extends TokenLogprob {
  top: TokenLogprob[];
}
