// Perplexity scoring: token ids cut into consecutive non-overlapping windows, each window
// predicting its tokens 1..n−1 from the tokens before them within the window (all-position
// prefill, log-softmax in float64). Measures a model; it does not generate.

import type { NativeSequence } from "../native/mod.ts";
import type { LoadedModel } from "./load.ts";

/** Window length when none is given (tokens). */
export const DEFAULT_SCORE_CONTEXT = 512;
/** Most logits one prefill call returns while scoring (floats): bounds memory to 64 MiB. */
const MAX_LOGITS_PER_CALL = 16 * 1024 * 1024;

/** Result of {@link scoreTokens}. */
export interface ScoreResult {
  /** Predicted positions: Σ over windows of (window length − 1). */
  tokens: number;
  /** Mean negative log-likelihood per predicted token, nats. */
  meanNll: number;
  /** exp(meanNll). */
  ppl: number;
}

/**
 * −log softmax(row)[target] in float64: logsumexp(row) − row[target].
 *
 * @param logits (rows, vocab) row-major float32
 * @param row row index
 * @param vocab row length
 * @param target the token whose probability is scored
 * @returns the negative log-likelihood, nats
 */
export function negLogLikelihood(
  logits: Float32Array,
  row: number,
  vocab: number,
  target: number,
): number {
  const base = row * vocab;
  let max = -Infinity;
  for (let j = 0; j < vocab; j++) if (logits[base + j] > max) max = logits[base + j];
  let sum = 0;
  for (let j = 0; j < vocab; j++) sum += Math.exp(logits[base + j] - max);
  return max + Math.log(sum) - logits[base + target];
}

/**
 * Scores token ids with the model: windows [0, N), [N, 2N), ...; a final window shorter than 2
 * tokens is dropped (it predicts nothing). Each window is prefilled into one reused sequence of
 * capacity N (truncated to 0 between windows), in slices that keep the logits under 64 MiB.
 *
 * @param model a loaded model
 * @param ids token ids (e.g. a whole file encoded without special tokens)
 * @param opts.context window length N ≥ 2; default {@link DEFAULT_SCORE_CONTEXT}
 * @returns predicted token count, mean NLL (nats) and perplexity
 * @throws {RangeError} when N is not an integer ≥ 2, or no window has 2 tokens (nothing to
 *   predict); {@link EngineError} from native calls
 */
export async function scoreTokens(
  model: LoadedModel,
  ids: ArrayLike<number>,
  opts: { context?: number } = {},
): Promise<ScoreResult> {
  const context = opts.context ?? DEFAULT_SCORE_CONTEXT;
  if (!Number.isSafeInteger(context) || context < 2) {
    throw new RangeError(`context must be an integer >= 2, got ${context}`);
  }
  const vocab = model.native.config.vocabSize;
  const sliceRows = Math.max(1, Math.floor(MAX_LOGITS_PER_CALL / vocab));
  let total = 0;
  let count = 0;
  let seq: NativeSequence | undefined;
  try {
    for (let start = 0; start + 2 <= ids.length; start += context) {
      const n = Math.min(context, ids.length - start);
      seq ??= model.native.createSequence(context);
      seq.truncate(0);
      const window = Array.from({ length: n }, (_, i) => ids[start + i]);
      // Only window[0 .. n−2] is fed: the last token predicts nothing inside the window.
      // Row r of a slice beginning at window position s predicts window[s + r + 1].
      for (let s = 0; s < n - 1; s += sliceRows) {
        const rows = Math.min(sliceRows, n - 1 - s);
        const logits = await seq.prefill(window.slice(s, s + rows), { allPositions: true });
        for (let r = 0; r < rows; r++) {
          total += negLogLikelihood(logits, r, vocab, window[s + r + 1]);
          count++;
        }
      }
    }
  } finally {
    seq?.free();
  }
  if (count === 0) {
    throw new RangeError(`nothing to score: ${ids.length} token(s), need a window of at least 2`);
  }
  const meanNll = total / count;
  return { tokens: count, meanNll, ppl: Math.exp(meanNll) };
}
