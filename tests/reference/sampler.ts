// The TypeScript sampler: the oracle the native sampler chain (native/src/host/sampling.cpp,
// lib/native/sampler.ts) is tested against, seeded draw for seeded draw. Greedy, or temperature →
// top_k → top_p → min_p (the order of transformers' warpers and vLLM) followed by a seeded draw
// from lib/engine/prng.ts's stream. One logits row at a time; no production code imports it.

import { randomSeed, Xoshiro128 } from "../../lib/engine/prng.ts";
import {
  checkTokenMask,
  type SamplingOptions,
  type TokenMask,
  validateSampling,
} from "../../lib/engine/sampling.ts";

/** The distribution a sampler draws from for one logits row: ids by descending probability. */
export interface TokenDistribution {
  /** Kept token ids, most likely first (ties: lower id first). */
  ids: Int32Array;
  /** Their probabilities after all filters, renormalised to sum to 1 (float64). */
  probs: Float64Array;
}

/** A logits row with no finite value (all NaN or −Inf): nothing can be drawn from it. */
export class NoFiniteLogitRowError extends RangeError {
  /** @param message names the row's length */
  constructor(message: string) {
    super(message);
    this.name = "NoFiniteLogitRowError";
  }
}

/** A masked row held no allowed token with a finite logit: nothing can be drawn from it. */
export class NoAllowedTokenRowError extends RangeError {
  /** @param message names the row's length */
  constructor(message: string) {
    super(message);
    this.name = "NoAllowedTokenRowError";
  }
}

/**
 * The row a masked draw runs on: logits where the mask allows the token, -Infinity elsewhere
 * (ids >= mask.nTokens included), so a disallowed token is never drawn and the allowed ones keep
 * their relative probabilities.
 *
 * @param logits one row
 * @param mask allowed tokens (checked with {@link checkTokenMask} by the caller)
 * @returns (logits.length,) float32
 */
export function maskRow(logits: ArrayLike<number>, mask: TokenMask): Float32Array {
  const out = new Float32Array(logits.length).fill(-Infinity);
  const end = Math.min(logits.length, mask.nTokens);
  for (let i = 0; i < end; i++) {
    if ((mask.words[i >>> 5] >>> (i & 31)) & 1) out[i] = logits[i];
  }
  return out;
}

/**
 * Index of the largest logit; NaN counts as -Infinity, ties go to the lowest index.
 *
 * @param logits one row, (vocab,) float32
 * @returns the argmax index
 * @throws {RangeError} when the row is empty or holds no value above -Infinity
 */
export function argmax(logits: ArrayLike<number>): number {
  let best = -1;
  let bestValue = -Infinity;
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i];
    if (v > bestValue) {
      bestValue = v;
      best = i;
    }
  }
  if (best < 0) {
    throw new NoFiniteLogitRowError(`argmax: no finite logit among ${logits.length} values`);
  }
  return best;
}

/**
 * The filtered, renormalised distribution a non-greedy sampler draws from:
 * softmax(logits / temperature) → top_k → (renormalise) top_p → min_p → renormalise.
 * top_p keeps the smallest prefix (by descending probability) whose cumulative probability is
 * ≥ topP, always at least one token; min_p keeps tokens with p ≥ minP · p_max. NaN logits count
 * as -Infinity and -Infinity logits are never kept.
 *
 * @param logits one row, (vocab,) float32 or float64
 * @param opts sampling options; temperature must be > 0 here
 * @returns kept ids (descending probability) and their probabilities (sum 1)
 * @throws {RangeError} on invalid options, temperature 0, or a row without a finite logit
 */
export function samplingDistribution(
  logits: ArrayLike<number>,
  opts: SamplingOptions,
): TokenDistribution {
  const { temperature, topK, topP, minP } = validateSampling(opts);
  if (temperature === 0) {
    throw new RangeError("samplingDistribution: temperature 0 is greedy, use argmax()");
  }
  const { max, total, finite } = softmaxMass(logits, temperature);
  if (max === Infinity) return samplingDistribution(limitRow(logits), opts);
  // Only tokens near the top can survive a filter, so sort just those: candidates are the ids
  // with scaled logit ≥ max − delta, widened (cheap O(vocab) passes, no sort) until the cut
  // provably falls inside them — exact, not an approximation. With no filter, all are kept.
  const noFilter = topK === 0 && topP >= 1 && minP === 0;
  let delta = noFilter ? Infinity : 1;
  const widen = () => (delta = delta > 1e4 ? Infinity : delta * 2);
  while (true) {
    const floor = max - delta * temperature;
    if (delta !== Infinity) {
      let count = 0;
      let mass = 0;
      for (let i = 0; i < logits.length; i++) {
        const v = logits[i];
        if (v >= floor) {
          count++;
          mass += Math.exp((v - max) / temperature);
        }
      }
      const enough = count === finite ||
        (topK > 0 ? count >= topK : topP < 1 ? mass >= topP * total : minP >= Math.exp(-delta));
      if (!enough) {
        widen();
        continue;
      }
    }
    const ids: number[] = [];
    for (let i = 0; i < logits.length; i++) {
      const v = logits[i];
      if (v > -Infinity && v >= floor) ids.push(i);
    }
    const all = ids.length === finite;
    if (topK > 0 && ids.length < topK && !all) {
      widen();
      continue;
    }
    ids.sort((a, b) => logits[b] - logits[a] || a - b);
    let n = topK > 0 ? Math.min(topK, ids.length) : ids.length;
    // (n,) float64 probabilities relative to the top token; normalised over the top_k set when
    // top_k is on, else over every finite token.
    const probs = new Float64Array(n);
    let sumKept = 0;
    for (let j = 0; j < n; j++) {
      probs[j] = Math.exp((logits[ids[j]] - max) / temperature);
      sumKept += probs[j];
    }
    const norm = topK > 0 ? sumKept : total;
    for (let j = 0; j < n; j++) probs[j] /= norm;
    let cutInside = topK > 0 || all;
    if (topP < 1) {
      let cumulative = 0;
      let keep = -1;
      for (let j = 0; j < n; j++) {
        cumulative += probs[j];
        if (cumulative >= topP) {
          keep = j + 1;
          break;
        }
      }
      if (keep < 0 && !cutInside) {
        widen();
        continue;
      }
      if (keep > 0) {
        n = keep;
        cutInside = true;
      }
    }
    if (minP > 0) {
      // Tokens left out have p < e^−delta · p_max: below the threshold when minP ≥ e^−delta.
      if (!cutInside && minP < Math.exp(-delta)) {
        widen();
        continue;
      }
      // probs[0] is p_max; the ratio test does not depend on renormalisation.
      const threshold = minP * probs[0];
      let keep = 1;
      while (keep < n && probs[keep] >= threshold) keep++;
      n = keep;
    } else if (!cutInside) {
      widen();
      continue;
    }
    const kept = probs.slice(0, n);
    let sum = 0;
    for (let j = 0; j < n; j++) sum += kept[j];
    for (let j = 0; j < n; j++) kept[j] /= sum;
    return { ids: Int32Array.from(ids.slice(0, n)), probs: kept };
  }
}

/**
 * The row sampling runs on when `logits` holds +Infinity: such a token outweighs every finite one,
 * so in the limit the +Infinity tokens share all the probability equally. The limit row has 0 for
 * them and -Infinity for everything else, which keeps Infinity − Infinity (NaN) out of the sums
 * and the candidate widening (a NaN floor made it spin forever). Greedy picks the same token
 * either way (the lowest-id +Infinity).
 *
 * @param logits one row holding at least one +Infinity
 * @returns (vocab,) float32: 0 where logits is +Infinity, -Infinity elsewhere
 */
export function limitRow(logits: ArrayLike<number>): Float32Array {
  const out = new Float32Array(logits.length).fill(-Infinity);
  for (let i = 0; i < logits.length; i++) if (logits[i] === Infinity) out[i] = 0;
  return out;
}

// Max logit, Σ exp((l − max)/T) over finite logits (float64), and how many are finite. The total
// is NaN when max is +Infinity: callers switch to limitRow() first.
function softmaxMass(
  logits: ArrayLike<number>,
  temperature: number,
): { max: number; total: number; finite: number } {
  let max = -Infinity;
  let finite = 0;
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i];
    if (v > -Infinity) {
      finite++;
      if (v > max) max = v;
    }
  }
  if (finite === 0) {
    throw new NoFiniteLogitRowError(`sampling: no finite logit among ${logits.length} values`);
  }
  let total = 0;
  for (let i = 0; i < logits.length; i++) {
    if (logits[i] > -Infinity) total += Math.exp((logits[i] - max) / temperature);
  }
  return { max, total, finite };
}

/**
 * Picks one token per logits row. Greedy when temperature is 0; otherwise draws from
 * {@link samplingDistribution} with its own xoshiro128** stream (seeded, or random when no seed).
 */
export class Sampler {
  /** The options in effect, defaults applied. */
  readonly options: Readonly<Required<Omit<SamplingOptions, "seed">>> & { seed: number };
  readonly #rng: Xoshiro128;
  readonly #greedy: boolean;

  /**
   * @param opts sampling options (see {@link SamplingOptions})
   * @throws {RangeError} when an option is out of range
   */
  constructor(opts: SamplingOptions = {}) {
    const valid = validateSampling(opts);
    const seed = opts.seed ?? randomSeed();
    this.options = { ...valid, seed };
    this.#rng = new Xoshiro128(seed);
    this.#greedy = valid.temperature === 0;
  }

  /**
   * Picks the next token.
   *
   * @param logits one row, (vocab,) float32
   * @param mask allowed tokens (structured output); absent = every token
   * @returns the chosen token id
   * @throws {RangeError} when the row holds no finite logit, or the mask is malformed;
   *   {@link NoAllowedTokenRowError} when no allowed token has a finite logit
   */
  sample(logits: Float32Array, mask?: TokenMask): number {
    if (mask) {
      checkTokenMask(mask);
      logits = maskRow(logits, mask);
      if (!logits.some((v) => v > -Infinity)) {
        throw new NoAllowedTokenRowError(
          `sampling: no token the mask allows has a finite logit among ${logits.length} values`,
        );
      }
    }
    if (this.#greedy) return argmax(logits);
    const { temperature, topK, topP, minP } = this.options;
    if (topK === 0 && topP >= 1 && minP === 0) {
      // Plain softmax sampling: one pass in id order, no sort.
      let { max, total } = softmaxMass(logits, temperature);
      if (max === Infinity) {
        logits = limitRow(logits);
        ({ max, total } = softmaxMass(logits, temperature));
      }
      const target = this.#rng.nextFloat() * total;
      let cumulative = 0;
      let last = -1;
      for (let i = 0; i < logits.length; i++) {
        if (!(logits[i] > -Infinity)) continue;
        cumulative += Math.exp((logits[i] - max) / temperature);
        last = i;
        if (target < cumulative) return i;
      }
      return last; // target within rounding of total
    }
    const { ids, probs } = samplingDistribution(logits, this.options);
    const u = this.#rng.nextFloat();
    let cumulative = 0;
    for (let j = 0; j < ids.length; j++) {
      cumulative += probs[j];
      if (u < cumulative) return ids[j];
    }
    return ids[ids.length - 1]; // u within rounding of 1
  }
}
