// The generation loop: prefill a prompt into a fresh native sequence, then sample → detokenize →
// check stops → decode, one token at a time, streaming text deltas. It owns the sequences it
// creates and frees them on every exit path; it does not schedule or batch several requests.

import {
  type LogprobRequest,
  NativeSampler,
  type NativeSamplingOptions,
  type NativeSequence,
  type SampleResult,
} from "../native/mod.ts";
import type { LoadedModel } from "./load.ts";
import {
  redrawIsExact,
  resolveSampling,
  type SamplingOptions,
  type TokenMask,
  validateSampling,
} from "./sampling.ts";
import { StopStringMatcher } from "./stop_strings.ts";
import { GrammarDraws } from "./grammar_draw.ts";
import { type LogitOptions, type StepLogprobs, validRepetitionPenalty } from "./logits.ts";
import { type Decoder, IncrementalDetokenizer } from "./detokenizer.ts";

/** Tokens generated when `maxTokens` is not given. */
export const DEFAULT_MAX_TOKENS = 256;
/** Upper bound on prompt + maxTokens for one sequence (KV capacity). */
export const MAX_SEQUENCE_TOKENS = 32768;

/** Options of one generation. */
export interface GenerateOptions extends SamplingOptions, LogitOptions {
  /** Most tokens to generate, ≥ 1; default {@link DEFAULT_MAX_TOKENS}. */
  maxTokens?: number;
  /** Stop strings: the text ends just before the first one found (it is not included). */
  stop?: string[];
  /** Token ids that end generation (not included in the text, included in tokenIds).
   *  Default: the model's eos ids; `[]` disables stopping on a token. */
  stopTokenIds?: number[];
  /** The stop token ids cannot be sampled before this many tokens were generated (vLLM's
   *  min_tokens; stop strings still apply). 0..maxTokens, default 0. */
  minTokens?: number;
  /** Aborting ends generation between tokens with finishReason "abort". */
  signal?: AbortSignal;
  /** Leave special tokens out of the text; default true (they stay in tokenIds). */
  skipSpecialTokens?: boolean;
  /** Structured output: a grammar's per-request matcher (lib/grammar GrammarMatcher). Every
   *  token is the draw under its mask (masked first, or drawn first and redrawn under the mask
   *  when rejected, where that is exact: grammar_draw.ts), each token is accepted into it, and a
   *  token that completes it ends the output (finishReason "stop"). The loop disposes it when it
   *  ends. */
  grammar?: TokenGrammar;
}

/** The part of a grammar matcher the decode loop uses (lib/grammar GrammarMatcher). */
export interface TokenGrammar {
  /** the tokens allowed next */
  nextMask(): Promise<TokenMask>;
  /** takes a drawn token; false when the grammar rejects it */
  accept(token: number): boolean;
  /** whether the output is complete (a stop token was accepted) */
  readonly terminated: boolean;
  /** frees it */
  dispose(): void;
}

/** Options of {@link continueFrom}: as {@link GenerateOptions}, plus the text context. */
export interface ContinueOptions extends GenerateOptions {
  /** The last few token ids already in the sequence, for the spacing of the first new text. */
  contextIds?: number[];
}

/** What a generation produced. */
export interface GenerateResult {
  /** Completion text, without the stop string or stop token. */
  text: string;
  /** Every sampled token, including the stop token or the token that completed a stop string. */
  tokenIds: number[];
  /** Tokens of the prompt (for continueFrom: tokens in the sequence at the start). */
  promptTokens: number;
  /** "stop": a stop token or string; "length": maxTokens reached; "abort": the signal fired. */
  finishReason: "stop" | "length" | "abort";
  /** Milliseconds from the call to the first sampled token (to the end when none was sampled). */
  ttftMs: number;
}

/** One streamed step: the text this token made final (may be "") and the token. */
export interface GenerateChunk {
  text: string;
  tokenId: number;
  /** Set when `logprobs` was asked for. */
  logprobs?: StepLogprobs;
}

/** The part of a sequence the decode loop needs (NativeSequence satisfies it). */
export interface DecodeTarget {
  decode(token: number): Promise<Float32Array>;
  /** Sampling inside the decode step (both or neither): a sampler for these options, and a decode
   *  step that samples the next token from its own logits. A target without them returns logits,
   *  which the loop samples with a native sampler of its own. */
  createSampler?(opts: NativeSamplingOptions): NativeSampler;
  decodeSample?(
    token: number,
    sampler: NativeSampler,
    width?: number,
    req?: LogprobRequest,
  ): Promise<SampleResult>;
  /** Several tokens at once (both or neither; a scheduler's bursts, lib/serve): appends `token`
   *  and resolves with 1..most+1 natively sampled tokens, each but the last appended already;
   *  rewind(n) drops the last n tokens (those past where the generation stopped). */
  decodeBurst?(
    token: number,
    sampler: NativeSampler,
    width: number | undefined,
    most: number,
  ): Promise<Int32Array>;
  rewind?(n: number): void;
}

/** Everything the decode loop needs besides the sequence. */
export interface DecodeContext {
  tokenizer: Decoder & { readonly vocabSize: number };
  /** Default stop token ids (the model's eos ids). */
  eosTokenIds: readonly number[];
  /** Ids before the generated ones, for detokenization context. */
  contextIds: ArrayLike<number>;
  /** Ids the repetition penalty counts as seen before the first generated token (the whole
   *  prompt); default contextIds. */
  penaltyIds?: ArrayLike<number>;
  promptTokens: number;
  /** performance.now() at the start of the call, for ttftMs. */
  startMs: number;
}

interface ResolvedOptions {
  maxTokens: number;
  stop: string[];
  stopTokenIds: number[] | undefined;
  minTokens: number;
  repetitionPenalty: number;
}

/**
 * Checks generation options before any work.
 *
 * @param opts generation options
 * @returns maxTokens with its default, stop strings, stop token ids as given
 * @throws {RangeError} for out-of-range sampling values or maxTokens
 * @throws {TypeError} for a stop list that is not non-empty strings, or bad stop token ids
 */
export function validateGenerateOptions(opts: GenerateOptions): ResolvedOptions {
  validateSampling(opts);
  const repetitionPenalty = validRepetitionPenalty(opts.repetitionPenalty);
  const maxTokens = opts.maxTokens ?? DEFAULT_MAX_TOKENS;
  if (!Number.isSafeInteger(maxTokens) || maxTokens < 1 || maxTokens > MAX_SEQUENCE_TOKENS) {
    throw new RangeError(
      `maxTokens must be an integer in [1, ${MAX_SEQUENCE_TOKENS}], got ${maxTokens}`,
    );
  }
  const minTokens = opts.minTokens ?? 0;
  if (!Number.isSafeInteger(minTokens) || minTokens < 0 || minTokens > maxTokens) {
    throw new RangeError(
      `minTokens must be an integer in [0, maxTokens ${maxTokens}], got ${minTokens}`,
    );
  }
  const stop = opts.stop ?? [];
  if (!Array.isArray(stop)) {
    throw new TypeError(`stop must be an array of strings, got ${JSON.stringify(stop)}`);
  }
  stop.forEach((s, i) => {
    if (typeof s !== "string" || s.length === 0) {
      throw new TypeError(`stop[${i}] must be a non-empty string, got ${JSON.stringify(s)}`);
    }
  });
  if (opts.stopTokenIds !== undefined) {
    if (!Array.isArray(opts.stopTokenIds)) {
      throw new TypeError(
        `stopTokenIds must be an array of token ids, got ${JSON.stringify(opts.stopTokenIds)}`,
      );
    }
    opts.stopTokenIds.forEach((id, i) => {
      if (!Number.isSafeInteger(id) || id < 0) {
        throw new TypeError(`stopTokenIds[${i}] must be a non-negative integer, got ${id}`);
      }
    });
  }
  return { maxTokens, stop, stopTokenIds: opts.stopTokenIds, minTokens, repetitionPenalty };
}

/**
 * The decode loop shared by {@link generateStream} and {@link continueFrom}: samples from
 * `firstLogits`, then feeds each sampled token to `target.decode` until a stop token, a stop
 * string, maxTokens or an abort. The last sampled token is never fed to the sequence, so on return
 * the sequence holds its earlier tokens plus tokenIds[0 .. n−2].
 *
 * @param target the sequence to decode with (not freed here)
 * @param firstLogits logits of the position after the sequence's last token, (vocab,) float32
 * @param ctx tokenizer, eos ids, context ids, prompt size and start time
 * @param opts generation options
 * @yields one {@link GenerateChunk} per sampled token
 * @returns the {@link GenerateResult}
 * @throws {RangeError|TypeError} for invalid options; errors from the sequence propagate
 */
export async function* decodeLoop(
  target: DecodeTarget,
  firstLogits: Float32Array,
  ctx: DecodeContext,
  opts: GenerateOptions = {},
): AsyncGenerator<GenerateChunk, GenerateResult> {
  const { maxTokens, stop, stopTokenIds, minTokens, repetitionPenalty } = validateGenerateOptions(
    opts,
  );
  const options = resolveSampling(opts);
  const stopper = new StopStringMatcher(stop);
  // Context ids the tokenizer cannot decode (embedding padding rows) are left out of the context.
  const contextIds = Array.from(ctx.contextIds).filter((id) => id < ctx.tokenizer.vocabSize);
  const detok = new IncrementalDetokenizer(ctx.tokenizer, contextIds, {
    skipSpecialTokens: opts.skipSpecialTokens ?? true,
  });
  const stopIds = new Set(stopTokenIds ?? ctx.eosTokenIds);
  // Ids past the tokenizer's vocabulary (padding rows of the embedding) are never sampled.
  const sampleWidth = Math.min(firstLogits.length, ctx.tokenizer.vocabSize);
  const tokenIds: number[] = [];
  let text = "";
  let ttftMs: number | undefined;
  let finishReason: GenerateResult["finishReason"] | undefined;
  let logits = firstLogits;
  const lpReq: LogprobRequest | undefined = opts.logprobs === undefined
    ? undefined
    : { logprob: true, topLogprobs: opts.logprobs };
  // Every draw is native: in the target's decode step when it samples there, else from the
  // logits it returns. The sampler applies the ban, bias and penalties itself.
  const stepSamples = target.createSampler !== undefined && target.decodeSample !== undefined;
  const native = stepSamples ? target.createSampler!(options) : NativeSampler.create(options);
  try {
    configureSampler(native, opts, {
      repetitionPenalty,
      penaltyIds: ctx.penaltyIds ?? contextIds,
      minTokens,
      stopIds,
    });
  } catch (e) {
    native.free();
    throw e;
  }
  let next: SampleResult | undefined; // what the last native decode step sampled
  // A burst's tokens not consumed yet (each already appended but the burst's last): without
  // logprobs, a target with bursts returns several tokens per call.
  // A grammar's next mask needs this token accepted first: one token per step then.
  const grammar = opts.grammar;
  const bursts = stepSamples && !lpReq && !grammar && target.decodeBurst !== undefined &&
    target.rewind !== undefined;
  // Each draw under a grammar is masked first, or drawn first and redrawn under the mask when
  // the grammar rejects it (grammar_draw.ts; only where that is exact: redrawIsExact).
  const draws = grammar &&
    new GrammarDraws(grammar, native, redrawIsExact(options), options.temperature === 0);
  let ahead: Int32Array | null = null;
  let aheadAt = 0;
  // Gives back the burst's tokens after the last one emitted (all appended already), so the cache
  // ends as after single steps.
  const giveBack = () => {
    if (ahead && aheadAt < ahead.length) target.rewind!(ahead.length - aheadAt);
    ahead = null;
  };
  try {
    await draws?.beforeDraw();
    while (finishReason === undefined) {
      if (opts.signal?.aborted) {
        finishReason = "abort";
        giveBack();
        break;
      }
      let r = next ?? native.sample(logits, sampleWidth, lpReq);
      if (draws) r = await draws.take(r, lpReq);
      const id = r.token;
      const logprobs = lpReq ? nativeLogprobs(r) : undefined;
      ttftMs ??= performance.now() - ctx.startMs;
      tokenIds.push(id);
      let delta: string;
      if (stopIds.has(id) || grammar?.terminated) {
        // The stop token's own text is not output; release what was withheld before it.
        const step = stopper.push(detok.flush());
        delta = step.emit + stopper.flush();
        finishReason = "stop";
      } else {
        const step = stopper.push(detok.push(id));
        delta = step.emit;
        if (step.stopped) {
          finishReason = "stop";
        } else if (tokenIds.length >= maxTokens) {
          const last = stopper.push(detok.flush());
          delta += last.emit + stopper.flush();
          finishReason = last.stopped ? "stop" : "length";
        }
      }
      text += delta;
      if (finishReason !== undefined) giveBack(); // stopped inside a burst
      yield logprobs ? { text: delta, tokenId: id, logprobs } : { text: delta, tokenId: id };
      if (finishReason === undefined) {
        if (ahead && aheadAt < ahead.length) {
          next = { token: ahead[aheadAt++] }; // appended already with the burst
        } else if (bursts) {
          ahead = await target.decodeBurst!(
            id,
            native,
            sampleWidth,
            maxTokens - tokenIds.length - 1,
          );
          next = { token: ahead[0] };
          aheadAt = 1;
        } else {
          await draws?.beforeDraw();
          if (stepSamples) next = await target.decodeSample!(id, native, sampleWidth, lpReq);
          else logits = await target.decode(id);
        }
      }
    }
  } finally {
    native.free();
    grammar?.dispose();
  }
  return {
    text,
    tokenIds,
    promptTokens: ctx.promptTokens,
    finishReason,
    ttftMs: ttftMs ?? performance.now() - ctx.startMs,
  };
}

/** What a generation's sampler applies besides the draw settings. */
interface SamplerProcessing {
  repetitionPenalty: number;
  /** ids the repetition penalty counts as seen before the first draw */
  penaltyIds: ArrayLike<number>;
  minTokens: number;
  /** the ids banned until minTokens */
  stopIds: ReadonlySet<number>;
}

/**
 * Gives a sampler the request's logit processing (vLLM's order, applied natively): the
 * min_tokens ban of the stop ids, logit_bias, the repetition penalty, presence and frequency
 * penalties. Settings that are off are not sent.
 */
function configureSampler(native: NativeSampler, opts: LogitOptions, p: SamplerProcessing): void {
  if (p.repetitionPenalty !== 1) native.setRepetitionPenalty(p.repetitionPenalty, p.penaltyIds);
  if ((opts.logitBias?.size ?? 0) > 0) native.setLogitBias(opts.logitBias!);
  const presence = opts.presencePenalty ?? 0, frequency = opts.frequencyPenalty ?? 0;
  if (presence !== 0 || frequency !== 0) native.setPresenceFrequency(presence, frequency);
  if (p.minTokens > 0 && p.stopIds.size > 0) native.setMinTokens(p.minTokens, [...p.stopIds]);
}

/** A native sample's logprobs in the engine's shape (asked with logprob and topLogprobs). */
function nativeLogprobs(r: SampleResult): StepLogprobs {
  const ids = r.top?.ids ?? new Int32Array(0);
  return {
    id: r.token,
    logprob: r.logprob!,
    top: Array.from(ids, (id, j) => ({ id, logprob: r.top!.logprobs[j] })),
  };
}

function promptIds(model: LoadedModel, prompt: string | number[]): number[] {
  if (typeof prompt === "string") return model.tokenizer.encode(prompt);
  if (!Array.isArray(prompt)) {
    throw new TypeError(`prompt must be a string or an array of token ids, got ${typeof prompt}`);
  }
  const vocab = model.native.config.vocabSize;
  prompt.forEach((id, i) => {
    if (!Number.isSafeInteger(id) || id < 0 || id >= vocab) {
      throw new RangeError(`prompt[${i}] = ${id} is not a token id in [0, ${vocab})`);
    }
  });
  return prompt;
}

/**
 * Generates a completion, streaming it: the prompt (a string is encoded without special tokens)
 * is prefilled into a fresh sequence of capacity prompt + maxTokens, which is freed when the
 * generator finishes, throws, or is closed early (`break` in for-await).
 *
 * @param model a loaded model
 * @param prompt text, or token ids
 * @param opts sampling, stops, maxTokens, abort signal
 * @yields per sampled token: the text it made final ("" while held back for a possible stop
 *   string or an incomplete character) and its id
 * @returns the {@link GenerateResult}; its text is the concatenation of the yielded texts
 * @throws {RangeError} for an empty prompt, bad ids or options, prompt + maxTokens over
 *   {@link MAX_SEQUENCE_TOKENS}; {@link EngineError} from native calls
 */
export async function* generateStream(
  model: LoadedModel,
  prompt: string | number[],
  opts: GenerateOptions = {},
): AsyncGenerator<GenerateChunk, GenerateResult> {
  const startMs = performance.now();
  const { maxTokens } = validateGenerateOptions(opts);
  const ids = promptIds(model, prompt);
  if (ids.length === 0) throw new RangeError("prompt is empty: it encodes to 0 tokens");
  if (ids.length + maxTokens > MAX_SEQUENCE_TOKENS) {
    throw new RangeError(
      `prompt (${ids.length} tokens) + maxTokens (${maxTokens}) exceeds ${MAX_SEQUENCE_TOKENS} tokens`,
    );
  }
  const ctxBase = {
    tokenizer: model.tokenizer,
    eosTokenIds: model.eosTokenIds,
    contextIds: ids,
    promptTokens: ids.length,
    startMs,
  };
  if (opts.signal?.aborted) {
    return {
      text: "",
      tokenIds: [],
      promptTokens: ids.length,
      finishReason: "abort",
      ttftMs: performance.now() - startMs,
    };
  }
  const seq = model.native.createSequence(ids.length + maxTokens);
  try {
    const logits = await seq.prefill(ids);
    return yield* decodeLoop(seq, logits, ctxBase, opts);
  } finally {
    seq.free();
  }
}

/**
 * Generates a completion and returns it whole (see {@link generateStream}).
 *
 * @param model a loaded model
 * @param prompt text (encoded without special tokens), or token ids
 * @param opts sampling, stops, maxTokens, abort signal
 * @returns the {@link GenerateResult}
 * @throws as {@link generateStream}
 */
export async function generate(
  model: LoadedModel,
  prompt: string | number[],
  opts: GenerateOptions = {},
): Promise<GenerateResult> {
  const stream = generateStream(model, prompt, opts);
  while (true) {
    const step = await stream.next();
    if (step.done) return step.value;
  }
}

/**
 * Continues decoding an existing sequence (e.g. one restored from a KV snapshot) whose last
 * prefill or decode returned `lastLogits`. The caller keeps ownership of `seq` (it is not freed);
 * on return it holds its earlier tokens plus every generated token but the last.
 *
 * @param model the model the sequence belongs to
 * @param seq the sequence
 * @param lastLogits logits after the sequence's last token, (vocab,) float32
 * @param opts as {@link GenerateOptions}, plus contextIds (the sequence's last token ids)
 * @returns the {@link GenerateResult} (promptTokens = seq.length at the call)
 * @throws {RangeError} when maxTokens − 1 more tokens do not fit in the sequence's capacity,
 *   or for bad options; {@link EngineError} from native calls
 */
export async function continueFrom(
  model: LoadedModel,
  seq: NativeSequence,
  lastLogits: Float32Array,
  opts: ContinueOptions = {},
): Promise<GenerateResult> {
  const startMs = performance.now();
  const { maxTokens } = validateGenerateOptions(opts);
  if (
    !(lastLogits instanceof Float32Array) || lastLogits.length !== model.native.config.vocabSize
  ) {
    throw new RangeError(
      `lastLogits must be a Float32Array of the vocabulary size ${model.native.config.vocabSize}, got length ${
        (lastLogits as { length?: number })?.length
      }`,
    );
  }
  const start = seq.length;
  if (start + maxTokens - 1 > seq.capacity) {
    throw new RangeError(
      `sequence holds ${start} of ${seq.capacity} tokens: no room for maxTokens ${maxTokens} (needs ${
        maxTokens - 1
      } more)`,
    );
  }
  const stream = decodeLoop(seq, lastLogits, {
    tokenizer: model.tokenizer,
    eosTokenIds: model.eosTokenIds,
    contextIds: opts.contextIds ?? [],
    promptTokens: start,
    startMs,
  }, opts);
  while (true) {
    const step = await stream.next();
    if (step.done) return step.value;
  }
}
