// Request-body schemas (zod) shared by the functions: sampling fields, chat messages, and the
// prompt forms (text, chat messages, token ids), plus request sampling fields → engine options.
// Field names follow OpenAI's API; validation only — tokenizing and generation are lib/serve's.
import { z } from "zod";
import type { GenerateOptions } from "../../lib/engine/mod.ts";
import { InputError, type Tier } from "../../lib/serve/mod.ts";

/** Sampling and length fields shared by every generating endpoint. */
export const samplingFields = {
  max_tokens: z.number().int().min(1).optional(),
  temperature: z.number().min(0).max(2).optional(),
  top_p: z.number().gt(0).max(1).optional(),
  top_k: z.number().int().min(1).optional(),
  min_p: z.number().min(0).max(1).optional(),
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
  seed?: number | null;
  stop?: string | string[] | null;
};

/**
 * Generation options from request fields, filled with the tier's defaults.
 * @param tier the tier serving the request
 * @param body request sampling fields
 * @param maxTokensParam the request field `body.max_tokens` came from (chat:
 *   max_completion_tokens)
 * @returns engine options
 * @throws {InputError} when max_tokens exceeds the tier's max_new_tokens
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
  const d = tier.config.sampling;
  return {
    maxTokens,
    temperature: body.temperature ?? d.temperature,
    topP: body.top_p ?? d.top_p,
    topK: body.top_k ?? d.top_k,
    minP: body.min_p ?? d.min_p,
    seed: body.seed ?? undefined,
    stop: body.stop == null ? undefined : typeof body.stop === "string" ? [body.stop] : body.stop,
  };
}
