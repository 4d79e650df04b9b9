// A request's prompt as token ids for a tier: plain text, chat messages through the tier's chat
// template, or token ids checked against the vocabulary. Validation of the request's shape is
// functions/'s (zod); this file only knows prompts and tokenizers.
import { InputError } from "./errors.ts";
import type { Tier } from "./tier.ts";

/** One chat message (validated by the caller); content is text or text parts. */
export interface ChatMessage {
  role: "system" | "user" | "assistant" | "developer" | "tool";
  content: string | { type: "text"; text: string }[];
}

/** A prompt in one of its forms: exactly one of text, messages, ids. */
export interface PromptInput {
  text?: string;
  messages?: ChatMessage[];
  ids?: number[];
}

/**
 * A message's text (text parts joined).
 * @param m the message
 * @returns its text
 */
export function messageText(m: ChatMessage): string {
  return typeof m.content === "string" ? m.content : m.content.map((p) => p.text).join("");
}

/**
 * Text of chat messages through the tier's chat template (with the generation prompt).
 * @param tier the tier
 * @param messages validated messages
 * @returns the prompt text
 */
export function chatPrompt(tier: Tier, messages: ChatMessage[]): string {
  return tier.model.tokenizer.applyChatTemplate(
    messages.map((m) => ({
      role: m.role === "developer" ? "system" : m.role,
      content: messageText(m),
    })),
    { addGenerationPrompt: true },
  );
}

/**
 * Token ids of a prompt given as text, chat messages or ids.
 * @param tier the tier (its tokenizer)
 * @param p exactly one of text, messages, ids
 * @param param request field quoted in errors
 * @returns ids (≥ 1)
 * @throws {InputError} for an empty encoding or an id outside the vocabulary
 */
export function promptIds(tier: Tier, p: PromptInput, param = "prompt"): number[] {
  let ids: number[];
  if (p.ids) {
    const vocab = tier.model.native.config.vocabSize;
    const bad = p.ids.findIndex((t) => t >= vocab);
    if (bad >= 0) {
      throw new InputError(
        `token id ${p.ids[bad]} at ${bad} is outside the vocabulary (${vocab})`,
        `${param}.${bad}`,
      );
    }
    ids = p.ids;
  } else if (p.messages) {
    ids = tier.model.tokenizer.encode(chatPrompt(tier, p.messages));
  } else {
    ids = tier.model.tokenizer.encode(p.text ?? "");
  }
  if (ids.length === 0) throw new InputError("prompt encodes to 0 tokens", param);
  return ids;
}
