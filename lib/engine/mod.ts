// Public face of lib/engine: model loading, sampling, and the generation loop (whole, streamed,
// or continued from an existing sequence). No HTTP, no snapshots, no scheduling across requests.

export { type LoadedModel, loadModel, type LoadTimings } from "./load.ts";
export {
  checkTokenMask,
  resolveSampling,
  type SamplingOptions,
  type TokenMask,
  validateSampling,
} from "./sampling.ts";
export {
  continueFrom,
  type ContinueOptions,
  decodeLoop,
  type DecodeTarget,
  DEFAULT_MAX_TOKENS,
  generate,
  type GenerateChunk,
  type GenerateOptions,
  type GenerateResult,
  generateStream,
  MAX_SEQUENCE_TOKENS,
  type TokenGrammar,
  validateGenerateOptions,
} from "./generate.ts";
export { DEFAULT_SCORE_CONTEXT, negLogLikelihood, type ScoreResult, scoreTokens } from "./score.ts";
export { type StopStep, StopStringMatcher } from "./stop_strings.ts";
export { IncrementalDetokenizer } from "./detokenizer.ts";
export { type LogitOptions, type StepLogprobs, type TokenLogprob } from "./logits.ts";
export { randomSeed, Xoshiro128 } from "./prng.ts";
