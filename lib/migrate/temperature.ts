// Temperature scaling of a migrated cache's predictions: per-row log-softmax in float64 at a
// temperature, the NLL/KL/top-1 helpers the evaluation uses, and the one-scalar fit (golden-section
// search on log T minimising held-out NLL). No model calls here.

/**
 * log softmax(row / T) of one logits row, float64.
 * @param logits (rows, vocab) row-major
 * @param row row index
 * @param vocab row length
 * @param temperature T > 0 (1 = unscaled)
 * @returns (vocab) log-probabilities
 */
export function logSoftmaxRow(
  logits: Float32Array,
  row: number,
  vocab: number,
  temperature = 1,
): Float64Array {
  const base = row * vocab, inv = 1 / temperature;
  const out = new Float64Array(vocab);
  let max = -Infinity;
  for (let j = 0; j < vocab; j++) {
    const z = logits[base + j] * inv;
    out[j] = z;
    if (z > max) max = z;
  }
  let sum = 0;
  for (let j = 0; j < vocab; j++) sum += Math.exp(out[j] - max);
  const lse = max + Math.log(sum);
  for (let j = 0; j < vocab; j++) out[j] -= lse;
  return out;
}

/**
 * KL(p ‖ q) = Σ p (log p − log q) of two log-probability rows, nats.
 * @param logP reference log-probabilities
 * @param logQ compared log-probabilities
 * @returns the divergence (>= 0)
 */
export function klDivergence(logP: Float64Array, logQ: Float64Array): number {
  let kl = 0;
  for (let j = 0; j < logP.length; j++) {
    const p = Math.exp(logP[j]);
    if (p > 0) kl += p * (logP[j] - logQ[j]);
  }
  return Math.max(0, kl);
}

/**
 * Index of the largest value (first on ties).
 * @param a values
 * @returns the index
 */
export function argmaxOf(a: ArrayLike<number>): number {
  let best = 0;
  for (let j = 1; j < a.length; j++) if (a[j] > a[best]) best = j;
  return best;
}

/**
 * Divides logits by T in place (the decode-time application of a fitted temperature).
 * @param logits (vocab) row
 * @param temperature T > 0
 * @returns the same array
 * @throws RangeError for T not finite and > 0
 */
export function applyTemperature(logits: Float32Array, temperature: number): Float32Array {
  if (!Number.isFinite(temperature) || temperature <= 0) {
    throw new RangeError(`temperature must be finite and > 0, got ${temperature}`);
  }
  if (temperature === 1) return logits;
  const inv = 1 / temperature;
  for (let j = 0; j < logits.length; j++) logits[j] *= inv;
  return logits;
}

/** Rows of logits with the token each row should predict. */
export interface ScoredRows {
  /** (rows, vocab) */
  logits: Float32Array;
  vocab: number;
  targets: number[];
}

/**
 * Mean NLL of the targets at temperature T.
 * @param sets scored rows
 * @param temperature T > 0
 * @returns mean NLL, nats
 */
export function meanNllAt(sets: ScoredRows[], temperature: number): number {
  let total = 0, count = 0;
  const inv = 1 / temperature;
  for (const s of sets) {
    for (let r = 0; r < s.targets.length; r++) {
      const base = r * s.vocab;
      let max = -Infinity;
      for (let j = 0; j < s.vocab; j++) max = Math.max(max, s.logits[base + j] * inv);
      let sum = 0;
      for (let j = 0; j < s.vocab; j++) sum += Math.exp(s.logits[base + j] * inv - max);
      total += max + Math.log(sum) - s.logits[base + s.targets[r]] * inv;
      count++;
    }
  }
  if (count === 0) throw new RangeError("no scored rows");
  return total / count;
}

/**
 * Fits one temperature minimising the mean NLL over the rows (golden-section search on log T in
 * [ln 0.25, ln 4], 25 steps; NLL(T) is convex in 1/T so the search finds its minimum).
 * @param sets scored rows (e.g. predictions made from migrated caches on held-out windows)
 * @returns T and the NLL before (T = 1) and after
 * @throws RangeError when there are no rows
 */
export function fitTemperature(
  sets: ScoredRows[],
): { temperature: number; nllBefore: number; nllAfter: number } {
  const f = (lt: number) => meanNllAt(sets, Math.exp(lt));
  let lo = Math.log(0.25), hi = Math.log(4);
  const g = (Math.sqrt(5) - 1) / 2;
  let x1 = hi - g * (hi - lo), x2 = lo + g * (hi - lo);
  let f1 = f(x1), f2 = f(x2);
  for (let i = 0; i < 25; i++) {
    if (f1 < f2) {
      hi = x2;
      x2 = x1;
      f2 = f1;
      x1 = hi - g * (hi - lo);
      f1 = f(x1);
    } else {
      lo = x1;
      x1 = x2;
      f1 = f2;
      x2 = lo + g * (hi - lo);
      f2 = f(x2);
    }
  }
  const t = Math.exp((lo + hi) / 2);
  const before = meanNllAt(sets, 1), after = meanNllAt(sets, t);
  // never store a temperature that does not help on the data it was fitted on
  return after < before
    ? { temperature: t, nllBefore: before, nllAfter: after }
    : { temperature: 1, nllBefore: before, nllAfter: before };
}
