// Do kvrelay and llama.cpp compute the same function? Runs one prompt through both (prefill, then
// greedy decode steps fed kvrelay's argmax) and reports, per step, the largest logit difference
// relative to the largest |logit| and whether the top-1 tokens agree. The bench refuses to time
// engines that disagree; it does not time anything itself.

import type { NativeModel } from "../../lib/native/mod.ts";
import type { LlamaContext } from "./llama_cpp.ts";

/** Largest |a − b| over largest |b|, and whether argmax agrees. */
export interface LogitsAgreement {
  relMaxDiff: number;
  top1Equal: boolean;
}

/** Index of the largest value. */
export function argmax(xs: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < xs.length; i++) if (xs[i] > xs[best]) best = i;
  return best;
}

/**
 * Compares two logit vectors.
 * @param a candidate logits
 * @param b reference logits (same length)
 * @returns relative max difference and top-1 agreement
 * @throws RangeError on different lengths
 */
export function compareLogits(a: ArrayLike<number>, b: ArrayLike<number>): LogitsAgreement {
  if (a.length !== b.length) throw new RangeError(`logits lengths ${a.length} vs ${b.length}`);
  let diff = 0, scale = 0;
  for (let i = 0; i < a.length; i++) {
    diff = Math.max(diff, Math.abs(a[i] - b[i]));
    scale = Math.max(scale, Math.abs(b[i]));
  }
  return { relMaxDiff: scale === 0 ? diff : diff / scale, top1Equal: argmax(a) === argmax(b) };
}

/** Agreement over a prompt and decode steps: the worst step and every step. */
export interface RunAgreement {
  worstRelMaxDiff: number;
  top1AgreeSteps: number;
  steps: number;
  perStep: LogitsAgreement[];
}

/**
 * Runs `ids` then `decodeSteps` greedy tokens through a kvrelay model and a llama.cpp context
 * (cleared first) and compares the logits at every step (llama.cpp vs kvrelay).
 * @param kvrelay the kvrelay model
 * @param llama a llama.cpp context of the same weights
 * @param ids prompt
 * @param decodeSteps tokens decoded after the prompt
 * @returns per-step agreement
 */
export async function runAgreement(
  kvrelay: NativeModel,
  llama: LlamaContext,
  ids: number[],
  decodeSteps: number,
): Promise<RunAgreement> {
  const seq = kvrelay.createSequence(ids.length + decodeSteps + 1);
  llama.clear();
  try {
    let k = await seq.prefill(ids);
    let l = llama.eval(ids);
    const perStep = [compareLogits(l, k)];
    for (let s = 0; s < decodeSteps; s++) {
      const next = argmax(k);
      k = await seq.decode(next);
      l = llama.eval([next]);
      perStep.push(compareLogits(l, k));
    }
    return {
      worstRelMaxDiff: Math.max(...perStep.map((p) => p.relMaxDiff)),
      top1AgreeSteps: perStep.filter((p) => p.top1Equal).length,
      steps: perStep.length,
      perStep,
    };
  } finally {
    seq.free();
    llama.clear();
  }
}
