// Sampling options of a request: what they mean, their checks and defaults, and the allowed-token
// mask of structured output. The draw itself is native (lib/native/sampler.ts, kvr_sampler); the
// TypeScript sampler it reproduces bit for bit is the tests' oracle (tests/reference/sampler.ts).

import { randomSeed } from "./prng.ts";

/** How to pick the next token. Fields left out are disabled (temperature defaults to 1). */
export interface SamplingOptions {
  /** 0 = greedy (argmax, lowest id on ties); > 0 divides the logits. Default 1. */
  temperature?: number;
  /** Keep only the k most likely tokens (ties at the boundary broken by lower id); 0 = off. */
  topK?: number;
  /** Nucleus: keep the smallest most-likely set whose probability reaches p; 1 = off. */
  topP?: number;
  /** Keep tokens whose probability is at least minP × the top probability; 0 = off. */
  minP?: number;
  /** Seed of the PRNG: same seed and logits → same tokens. Absent = a random seed. */
  seed?: number;
}

/** Sampling options with their defaults applied. */
export interface ValidSampling {
  temperature: number;
  topK: number;
  topP: number;
  minP: number;
}

/**
 * Checks sampling options and fills in defaults.
 *
 * @param opts user options
 * @returns temperature, topK, topP, minP with defaults applied
 * @throws {RangeError} when a value is out of range (the message quotes it)
 */
export function validateSampling(opts: SamplingOptions): ValidSampling {
  const temperature = opts.temperature ?? 1;
  const topK = opts.topK ?? 0;
  const topP = opts.topP ?? 1;
  const minP = opts.minP ?? 0;
  if (typeof temperature !== "number" || !Number.isFinite(temperature) || temperature < 0) {
    throw new RangeError(`temperature must be a finite number >= 0, got ${temperature}`);
  }
  if (!Number.isSafeInteger(topK) || topK < 0) {
    throw new RangeError(`topK must be an integer >= 0 (0 = off), got ${topK}`);
  }
  if (typeof topP !== "number" || !(topP > 0 && topP <= 1)) {
    throw new RangeError(`topP must be in (0, 1], got ${topP}`);
  }
  if (typeof minP !== "number" || !(minP >= 0 && minP <= 1)) {
    throw new RangeError(`minP must be in [0, 1], got ${minP}`);
  }
  if (opts.seed !== undefined && !Number.isSafeInteger(opts.seed)) {
    throw new RangeError(`seed must be a safe integer, got ${opts.seed}`);
  }
  return { temperature, topK, topP, minP };
}

/**
 * Checks sampling options and resolves the seed: a random one when none is given, so the draws of
 * one generation are one reproducible stream either way.
 *
 * @param opts user options
 * @returns the checked settings with a concrete seed
 * @throws {RangeError} as {@link validateSampling}
 */
export function resolveSampling(opts: SamplingOptions): ValidSampling & { seed: number } {
  return { ...validateSampling(opts), seed: opts.seed ?? randomSeed() };
}

/**
 * Whether a grammar's draw may be taken unmasked and redrawn under the mask only when the grammar
 * rejects it (NativeSampler.keepRow / redraw) with the masked draw's result: greedy (the same
 * token) or no top-k, top-p or min-p filter (the same distribution; the proof is at
 * kvr_sampler_redraw in native/include/kvrelay.h). Filters over the unmasked row keep other
 * tokens than filters over the masked row, so those draws are masked first.
 *
 * @param o resolved sampling settings
 * @returns whether draw-then-redraw is exact for them
 */
export function redrawIsExact(o: ValidSampling): boolean {
  return o.temperature === 0 || (o.topK === 0 && o.topP === 1 && o.minP === 0);
}

/** The allowed tokens of one draw (structured output: a grammar's next-token bitmask). Bit
 *  t % 32 of words[t / 32] set = token t may be drawn; ids >= nTokens never may. The layout of
 *  XGrammar's bitmask and of kvr_sampler_set_mask. */
export interface TokenMask {
  /** (ceil(nTokens / 32),) bit words; bits past nTokens are 0 */
  words: Uint32Array;
  /** how many token ids the mask covers (>= 1) */
  nTokens: number;
}

/**
 * Checks a token mask's shape: nTokens an integer >= 1, words of length ceil(nTokens / 32), no
 * bit at or past nTokens, at least one bit set (the checks of kvr_sampler_set_mask).
 *
 * @param mask the mask
 * @param vocab when given, the vocabulary the mask must fit (nTokens <= vocab)
 * @throws {RangeError} naming what is wrong
 */
export function checkTokenMask(mask: TokenMask, vocab?: number): void {
  const { words, nTokens } = mask ?? {};
  if (!(words instanceof Uint32Array)) throw new TypeError("mask.words must be a Uint32Array");
  if (!Number.isInteger(nTokens) || nTokens < 1 || nTokens > 0xffff_ffff) {
    throw new RangeError(`mask.nTokens must be an integer in [1, 2^32), got ${nTokens}`);
  }
  const need = Math.ceil(nTokens / 32);
  if (words.length !== need) {
    throw new RangeError(
      `a mask of ${nTokens} tokens takes ${need} words, got mask.words.length ${words.length}`,
    );
  }
  if (vocab !== undefined && nTokens > vocab) {
    throw new RangeError(`the mask covers ${nTokens} tokens, the vocabulary has ${vocab}`);
  }
  const tail = nTokens % 32;
  if (tail !== 0 && words[need - 1] >>> tail !== 0) {
    throw new RangeError(`the mask allows a token id >= nTokens ${nTokens}`);
  }
  if (!words.some((w) => w !== 0)) throw new RangeError("the mask allows no token");
}
