// Request-body schemas (zod) shared by the functions: sampling fields, chat messages, and the
// prompt forms (text, chat messages, token ids), plus request sampling fields → engine options.
// Field names follow OpenAI's API; validation only — tokenizing and generation are lib/serve's.
import { z } from "zod";
import type { GenerateOptions } from "../../lib/engine/mod.ts";
import { InputError, type Tier, tierSampling } from "../../lib/serve/mod.ts";

/** Sampling and length fields shared by every generating endpoint: OpenAI's, plus vLLM's
 *  extra sampling parameters with vLLM's ranges (null = not given). */
export const samplingFields = {
  max_tokens: z.number().int().min(1).optional(),
  temperature: z.number().min(0).max(2).optional(),
  top_p: z.number().gt(0).max(1).optional(),
  /** vLLM: -1 or 0 = off. */
  top_k: z.number().int().min(-1).nullish(),
  min_p: z.number().min(0).max(1).nullish(),
  /** vLLM/transformers: > 0; 1 = off, > 1 discourages repeats of prompt and output tokens. */
  repetition_penalty: z.number().gt(0).nullish(),
  /** vLLM: the stop tokens cannot be sampled before this many tokens (≤ max_tokens). */
  min_tokens: z.number().int().min(0).nullish(),
  /** vLLM: more token ids that end the generation (not part of the text). */
  stop_token_ids: z.array(z.number().int().min(0)).nullish(),
  /** vLLM: keep generating past the model's EOS tokens. */
  ignore_eos: z.boolean().nullish(),
  seed: z.number().int().min(0).max(2 ** 32 - 1).optional(),
  stop: z.union([z.string().min(1), z.array(z.string().min(1)).max(4)], {
    error: "must be a non-empty string or an array of at most 4 non-empty strings",
  }).nullish(),
};

/** One chat message; content is text or an array of text parts. */
export const messageSchema = z.object({
  role: z.enum(["system", "user", "assistant", "developer", "tool"]),
  content: z.union([
    z.string(),
    z.array(z.object({ type: z.literal("text"), text: z.string() })),
  ], { error: 'must be a string or an array of {"type": "text", "text": string} parts' }),
});

/** A list of chat messages (≥ 1). */
export const messagesSchema = z.array(messageSchema).min(1);

/** Token ids. */
export const tokenIdsSchema = z.array(z.number().int().min(0)).min(1);

type Sampling = {
  max_tokens?: number | null;
  temperature?: number | null;
  top_p?: number | null;
  top_k?: number | null;
  min_p?: number | null;
  repetition_penalty?: number | null;
  min_tokens?: number | null;
  stop_token_ids?: number[] | null;
  ignore_eos?: boolean | null;
  seed?: number | null;
  stop?: string | string[] | null;
};

/**
 * Generation options from request fields, filled with the tier's defaults (tierSampling: the
 * model's generation_config.json under the tier's `sampling`). Stop tokens: the model's EOS ids
 * (none with ignore_eos) plus stop_token_ids.
 * @param tier the tier serving the request
 * @param body request sampling fields
 * @param maxTokensParam the request field `body.max_tokens` came from (chat:
 *   max_completion_tokens)
 * @returns engine options
 * @throws {InputError} when max_tokens exceeds the tier's max_new_tokens, min_tokens exceeds
 *   max_tokens, or a stop_token_ids entry is outside the vocabulary
 */
export function generationOptions(
  tier: Tier,
  body: Sampling,
  maxTokensParam = "max_tokens",
): Omit<GenerateOptions, "signal"> {
  const maxTokens = body.max_tokens ?? tier.config.default_max_tokens;
  if (maxTokens > tier.config.max_new_tokens) {
    throw new InputError(
      `${maxTokensParam} ${maxTokens} exceeds tier "${tier.name}"'s max_new_tokens ${tier.config.max_new_tokens}`,
      maxTokensParam,
    );
  }
  const minTokens = body.min_tokens ?? 0;
  if (minTokens > maxTokens) {
    throw new InputError(
      `min_tokens ${minTokens} must be less than or equal to max_tokens ${maxTokens}`,
      "min_tokens",
    );
  }
  const vocab = tier.model.tokenizer.vocabSize;
  const extraStops = body.stop_token_ids ?? [];
  extraStops.forEach((id, i) => {
    if (id >= vocab) {
      throw new InputError(
        `stop_token_ids[${i}] = ${id} is outside the vocabulary (${vocab})`,
        `stop_token_ids.${i}`,
      );
    }
  });
  const d = tierSampling(tier);
  const topK = body.top_k ?? d.top_k;
  return {
    maxTokens,
    temperature: body.temperature ?? d.temperature,
    topP: body.top_p ?? d.top_p,
    topK: topK === undefined ? undefined : Math.max(0, topK), // -1 = off, as 0
    minP: body.min_p ?? d.min_p,
    repetitionPenalty: body.repetition_penalty ?? d.repetition_penalty,
    minTokens: minTokens > 0 ? minTokens : undefined,
    stopTokenIds: body.ignore_eos !== true && extraStops.length === 0
      ? undefined // the engine's default: the model's EOS ids
      : [...new Set([...(body.ignore_eos === true ? [] : tier.model.eosTokenIds), ...extraStops])],
    seed: body.seed ?? undefined,
    stop: body.stop == null ? undefined : typeof body.stop === "string" ? [body.stop] : body.stop,
  };
}
