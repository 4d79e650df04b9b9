// OpenAI request semantics of /v1/completions and /v1/chat/completions: every field OpenAI's API
// defines is validated with OpenAI's types and ranges (400 naming `param`); fields kvrelay does
// not implement (legacy functions, suffix, echo, audio, ...) are
// refused with a 400 that says so; unknown fields are refused like OpenAI does ("Unrecognized
// request argument"). Also the logprobs objects of both APIs. Routes live in app.ts.
import { z } from "zod";
import type { GenerateOptions, StepLogprobs } from "../../lib/engine/mod.ts";
import { InputError, type Tier } from "../../lib/serve/mod.ts";
import { samplingFields, tokenIdsSchema } from "../shared/mod.ts";
import { responseFormatSchema } from "./structured.ts";
import { chatMessagesSchema, toolChoiceSchema, toolSchema } from "./tools.ts";

/** Fields both APIs share (OpenAI's names and ranges, plus kvrelay's top_k/min_p/cache_salt). */
const common = {
  model: z.string().min(1).optional(),
  stream: z.boolean().nullish(),
  stream_options: z.strictObject({ include_usage: z.boolean().optional() }).nullish(),
  n: z.number().int().min(1).max(128).nullish(),
  user: z.string().max(256).optional(),
  frequency_penalty: z.number().min(-2).max(2).nullish(),
  presence_penalty: z.number().min(-2).max(2).nullish(),
  logit_bias: z.record(
    z.string().regex(/^\d{1,9}$/, "keys must be token ids"),
    z.number().min(-100).max(100),
  ).nullish(),
  /** vLLM's: isolates this request's prefix-cache entries within its tenant. */
  cache_salt: z.string().min(1).max(256).optional(),
  ...samplingFields,
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
};

/** POST /v1/completions body. */
export const completionSchema = z.strictObject({
  ...common,
  prompt: z.union([
    z.string().min(1),
    z.array(z.string().min(1)).min(1).max(16),
    tokenIdsSchema,
    z.array(tokenIdsSchema).min(1).max(16),
  ], {
    error:
      "must be a non-empty string, 1 to 16 non-empty strings, an array of token ids (integers >= 0), or 1 to 16 such arrays",
  }),
  max_tokens: z.number().int().min(1).nullish(),
  logprobs: z.number().int().min(0).max(5).nullish(),
  echo: z.boolean().nullish(),
  best_of: z.number().int().min(1).max(20).nullish(),
  suffix: z.string().nullish(),
  response_format: responseFormatSchema,
});

/** POST /v1/chat/completions body. */
export const chatSchema = z.strictObject({
  ...common,
  messages: chatMessagesSchema,
  max_tokens: z.number().int().min(1).nullish(),
  max_completion_tokens: z.number().int().min(1).nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int().min(0).max(20).nullish(),
  response_format: responseFormatSchema,
  tools: z.array(toolSchema).max(128).nullish(),
  tool_choice: toolChoiceSchema,
  parallel_tool_calls: z.boolean().nullish(),
  functions: z.array(z.unknown()).nullish(),
  function_call: z.unknown().optional(),
  metadata: z.record(z.string().max(64), z.string().max(512)).nullish(),
  store: z.boolean().nullish(),
  service_tier: z.string().nullish(),
  modalities: z.array(z.string()).nullish(),
  audio: z.unknown().optional(),
  prediction: z.unknown().optional(),
  reasoning_effort: z.string().nullish(),
  web_search_options: z.unknown().optional(),
});

function unsupported(param: string, what: string): InputError {
  return new InputError(`${what} is not supported by kvrelay`, param);
}

/**
 * Refuses known-but-unsupported features of a chat request with a 400 that says so.
 * @param b the parsed body
 * @throws {InputError} naming the field
 */
export function refuseUnsupportedChat(b: z.infer<typeof chatSchema>): void {
  if (b.functions != null && b.functions.length > 0) {
    throw unsupported("functions", "function calling (functions)");
  }
  if (b.function_call !== undefined && b.function_call !== null && b.function_call !== "none") {
    throw unsupported("function_call", "function calling (function_call)");
  }
  if (b.modalities != null && b.modalities.some((m) => m !== "text")) {
    throw unsupported("modalities", "output modalities other than text");
  }
  if (b.audio !== undefined && b.audio !== null) throw unsupported("audio", "audio output");
  if (b.prediction !== undefined && b.prediction !== null) {
    throw unsupported("prediction", "predicted outputs");
  }
  if (b.reasoning_effort != null) throw unsupported("reasoning_effort", "reasoning_effort");
  if (b.web_search_options !== undefined && b.web_search_options !== null) {
    throw unsupported("web_search_options", "web search");
  }
  if (b.top_logprobs != null && b.logprobs !== true) {
    throw new InputError("top_logprobs requires logprobs: true", "top_logprobs");
  }
}

/**
 * Refuses known-but-unsupported features of a completions request.
 * @param b the parsed body
 * @throws {InputError} naming the field
 */
export function refuseUnsupportedCompletion(b: z.infer<typeof completionSchema>): void {
  if (b.echo === true) throw unsupported("echo", "echo");
  if (b.suffix != null && b.suffix !== "") throw unsupported("suffix", "suffix (insertion)");
}

/** Fields of either API that become engine options beyond the shared sampling ones. */
export interface OpenAiExtras {
  frequency_penalty?: number | null;
  presence_penalty?: number | null;
  logit_bias?: Record<string, number> | null;
}

/**
 * Engine options for bias, penalties and logprobs, checked against the tier's vocabulary.
 * @param tier the tier (its vocabulary)
 * @param b the request's fields
 * @param logprobs how many alternatives to report (undefined: none)
 * @returns options to merge into the generation's
 * @throws {InputError} naming `logit_bias.<id>` for an id outside the vocabulary
 */
export function extraOptions(
  tier: Tier,
  b: OpenAiExtras,
  logprobs: number | undefined,
): Pick<GenerateOptions, "logitBias" | "presencePenalty" | "frequencyPenalty" | "logprobs"> {
  const vocab = tier.model.tokenizer.vocabSize;
  let logitBias: Map<number, number> | undefined;
  if (b.logit_bias) {
    logitBias = new Map();
    for (const [k, v] of Object.entries(b.logit_bias)) {
      const id = Number(k);
      if (id >= vocab) {
        throw new InputError(
          `logit_bias: token id ${id} is outside the vocabulary (${vocab})`,
          `logit_bias.${k}`,
        );
      }
      logitBias.set(id, v);
    }
  }
  return {
    logitBias,
    presencePenalty: b.presence_penalty ?? undefined,
    frequencyPenalty: b.frequency_penalty ?? undefined,
    logprobs,
  };
}

/** OpenAI encodes an impossible token's logprob as this instead of -Infinity (not JSON). */
const FLOOR = -9999;

function lp(x: number): number {
  return Number.isFinite(x) ? x : FLOOR;
}

/** Text and UTF-8 bytes of one token as the logprobs objects show it. */
export function tokenText(tier: Tier, id: number): { token: string; bytes: number[] } {
  const token = tier.model.tokenizer.decode([id]);
  return { token, bytes: [...new TextEncoder().encode(token)] };
}

/**
 * One entry of a chat completion's `logprobs.content`.
 * @param tier the tier (its tokenizer)
 * @param s the step's logprobs
 * @returns {token, logprob, bytes, top_logprobs}
 */
export function chatLogprob(tier: Tier, s: StepLogprobs) {
  return {
    ...tokenText(tier, s.id),
    logprob: lp(s.logprob),
    top_logprobs: s.top.map((t) => ({ ...tokenText(tier, t.id), logprob: lp(t.logprob) })),
  };
}

/**
 * A completions choice's `logprobs` object for a run of steps.
 * @param tier the tier (its tokenizer)
 * @param steps the steps' logprobs, in order
 * @param offset text offset of the first step's token
 * @returns {tokens, token_logprobs, top_logprobs, text_offset}
 */
export function completionLogprobs(tier: Tier, steps: StepLogprobs[], offset = 0) {
  const tokens: string[] = [], tokenLogprobs: number[] = [], textOffset: number[] = [];
  const top: Record<string, number>[] = [];
  let o = offset;
  for (const s of steps) {
    const t = tokenText(tier, s.id).token;
    tokens.push(t);
    tokenLogprobs.push(lp(s.logprob));
    textOffset.push(o);
    o += t.length;
    const alt: Record<string, number> = {};
    for (const a of s.top) alt[tokenText(tier, a.id).token] ??= lp(a.logprob);
    top.push(alt);
  }
  return { tokens, token_logprobs: tokenLogprobs, top_logprobs: top, text_offset: textOffset };
}
