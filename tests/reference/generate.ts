// A reference generation loop over the native model's logits: every draw by the TypeScript sampler
// and logit processor (./sampler.ts, ./logits.ts), one decode per token, stop token ids and
// maxTokens only (no stop strings, no text). The oracle of lib/engine's decodeLoop, whose draws are
// native: the same options and seed must give the same tokens and logprobs.

import type { GenerateOptions, LoadedModel, StepLogprobs } from "../../lib/engine/mod.ts";
import { DEFAULT_MAX_TOKENS } from "../../lib/engine/mod.ts";
import { LogitProcessor, stepLogprobs } from "./logits.ts";
import { Sampler } from "./sampler.ts";

/** One drawn token and, when asked, its logprobs. */
export interface ReferenceStep {
  tokenId: number;
  logprobs?: StepLogprobs;
}

/**
 * Generates from `prompt` with the reference sampler.
 *
 * @param model a loaded model
 * @param prompt text (encoded without special tokens)
 * @param opts sampling (with a seed for a reproducible draw), logit processing, maxTokens,
 *   stopTokenIds, minTokens, logprobs
 * @returns the drawn tokens, the stop token included
 */
export async function referenceGenerate(
  model: LoadedModel,
  prompt: string,
  opts: GenerateOptions,
): Promise<ReferenceStep[]> {
  const ids = model.tokenizer.encode(prompt);
  const maxTokens = opts.maxTokens ?? DEFAULT_MAX_TOKENS;
  const stopIds = new Set(opts.stopTokenIds ?? model.eosTokenIds);
  const minTokens = opts.minTokens ?? 0;
  const ban = minTokens > 0 && stopIds.size > 0 ? { minTokens, ids: [...stopIds] } : undefined;
  const processor = new LogitProcessor(opts, ids, ban);
  const sampler = new Sampler(opts);
  const seq = model.native.createSequence(ids.length + maxTokens);
  try {
    let logits = await seq.prefill(ids);
    const width = Math.min(logits.length, model.tokenizer.vocabSize);
    const steps: ReferenceStep[] = [];
    while (true) {
      const row = processor.process(logits.subarray(0, width));
      const id = sampler.sample(row);
      processor.push(id);
      steps.push(
        opts.logprobs === undefined
          ? { tokenId: id }
          : { tokenId: id, logprobs: stepLogprobs(row, id, opts.logprobs) },
      );
      if (stopIds.has(id) || steps.length >= maxTokens) return steps;
      logits = await seq.decode(id);
    }
  } finally {
    seq.free();
  }
}
