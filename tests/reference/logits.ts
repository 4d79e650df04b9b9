// The TypeScript logit processing: the oracle of the native sampler's (kvr_sampler_set_*), in
// vLLM's order — tokens banned until min_tokens (the stop ids), logit_bias (added to the named
// tokens' logits), the repetition penalty of transformers and vLLM over the prompt and the tokens
// generated so far (logit / p when positive, logit · p otherwise), then OpenAI's presence and
// frequency penalties over the generated tokens (logit −= count·frequency + [count > 0]·presence)
// — and log-probabilities of the processed row (log-softmax at temperature 1, before
// temperature/top-k/top-p filtering). One row at a time; no production code imports it.

import {
  type LogitOptions,
  type StepLogprobs,
  type TokenLogprob,
  validRepetitionPenalty,
} from "../../lib/engine/logits.ts";
import { limitRow } from "./sampler.ts";

/**
 * The repetition penalty of transformers and vLLM on one row: the logit of every id in `seen`
 * (ids ≥ the row's width are ignored) is divided by `penalty` when positive and multiplied by it
 * otherwise, in float64 rounded to float32 (the native sampler's arithmetic, bit for bit).
 * @param row one row, changed in place
 * @param seen the ids seen so far (prompt and generated), each once
 * @param penalty > 0; 1 leaves the row as it is
 * @returns the row
 */
export function applyRepetitionPenalty(
  row: Float32Array,
  seen: Iterable<number>,
  penalty: number,
): Float32Array {
  if (penalty === 1) return row;
  for (const id of seen) {
    if (id < 0 || id >= row.length) continue;
    const v = row[id];
    row[id] = v > 0 ? v / penalty : v * penalty;
  }
  return row;
}

/** Tokens banned (logit −Infinity) while fewer than `minTokens` tokens have been generated. */
export interface MinTokensBan {
  minTokens: number;
  ids: readonly number[];
}

/** Applies bans, bias and penalties to logit rows, tracking the tokens seen so far. */
export class LogitProcessor {
  readonly #counts = new Map<number, number>();
  readonly #seen: Set<number>;
  readonly #repetition: number;
  readonly #ban: MinTokensBan | undefined;
  #generated = 0;

  /**
   * @param opts bias, penalties, logprobs
   * @param contextIds tokens before the generated ones (the prompt), for the repetition penalty
   * @param ban stop ids suppressed until min_tokens tokens were generated
   */
  constructor(readonly opts: LogitOptions, contextIds: ArrayLike<number> = [], ban?: MinTokensBan) {
    this.#repetition = validRepetitionPenalty(opts.repetitionPenalty);
    this.#seen = new Set(this.#repetition === 1 ? [] : Array.from(contextIds));
    this.#ban = ban;
  }

  /**
   * The processed row (a copy; the input is not changed).
   * @param logits one row, (width,) float32
   * @returns bans applied, bias added, penalties applied
   */
  process(logits: Float32Array): Float32Array {
    const out = logits.slice();
    if (this.#ban && this.#generated < this.#ban.minTokens) {
      for (const id of this.#ban.ids) if (id < out.length) out[id] = -Infinity;
    }
    for (const [id, b] of this.opts.logitBias ?? []) if (id < out.length) out[id] += b;
    applyRepetitionPenalty(out, this.#seen, this.#repetition);
    const fp = this.opts.frequencyPenalty ?? 0, pp = this.opts.presencePenalty ?? 0;
    if (fp !== 0 || pp !== 0) {
      for (const [id, n] of this.#counts) if (id < out.length) out[id] -= n * fp + pp;
    }
    return out;
  }

  /**
   * Records a generated token (for the penalties and bans of later steps).
   * @param id the token
   */
  push(id: number): void {
    this.#generated++;
    this.#counts.set(id, (this.#counts.get(id) ?? 0) + 1);
    if (this.#repetition !== 1) this.#seen.add(id);
  }
}

/**
 * Log-probabilities of a processed row (log-softmax in float64).
 * @param logits the processed row
 * @param chosen the sampled token
 * @param top how many alternatives (most likely first; ties: lower id first; only tokens with a
 *   finite logit, so fewer when the row has fewer) — the native sampler's rule, bit for bit
 * @returns the chosen token's log-probability and the top alternatives
 */
export function stepLogprobs(logits: Float32Array, chosen: number, top: number): StepLogprobs {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
  if (max === Infinity) {
    // +Infinity tokens share the probability (sampler.ts limitRow): -log(count) each, others -Infinity
    logits = limitRow(logits);
    max = 0;
  }
  let sum = 0;
  for (let i = 0; i < logits.length; i++) {
    if (logits[i] > -Infinity) sum += Math.exp(logits[i] - max);
  }
  const lse = max + Math.log(sum);
  const lp = (i: number) => (logits[i] > -Infinity ? logits[i] - lse : -Infinity);
  const best: TokenLogprob[] = [];
  if (top > 0) {
    // Keep the `top` largest in a small sorted list: O(vocab · top) with top ≤ 20.
    for (let i = 0; i < logits.length; i++) {
      const v = logits[i];
      if (!(v > -Infinity)) continue; // impossible tokens (and NaN) are no alternatives
      if (best.length === top && !(v > logits[best[top - 1].id])) continue;
      let j = best.length < top ? best.length : top - 1;
      if (best.length < top) best.push({ id: i, logprob: 0 });
      while (j > 0 && v > logits[best[j - 1].id]) {
        best[j] = best[j - 1];
        j--;
      }
      best[j] = { id: i, logprob: 0 };
    }
    for (const b of best) b.logprob = lp(b.id);
  }
  return { id: chosen, logprob: lp(chosen), top: best };
}
