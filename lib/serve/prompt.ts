// A request's prompt as token ids for a tier: plain text, chat messages through the tier's chat
// template, or token ids checked against the vocabulary. Tokenizing is bounded before it starts
// (a text longer than max_context tokens can cover is refused unread) and long texts are
// tokenized on a worker thread, so a megabyte prompt neither costs seconds nor stalls the event
// loop. Validation of the request's shape is functions/'s (zod).
import type { ChatToolCall } from "../tokenizer/mod.ts";
import { InputError } from "./errors.ts";
import type { Tier } from "./tier.ts";

/** One chat message (validated by the caller); content is text or text parts, null only on an
 *  assistant message that carries tool calls. */
export interface ChatMessage {
  role: "system" | "user" | "assistant" | "developer" | "tool";
  content?: string | { type: "text"; text: string }[] | null;
  /** an assistant's calls (arguments: a JSON string, as OpenAI sends them) */
  tool_calls?: ChatToolCall[];
  /** a tool message's: the call it answers */
  tool_call_id?: string;
}

/** A prompt in one of its forms: exactly one of text, messages, ids. */
export interface PromptInput {
  text?: string;
  messages?: ChatMessage[];
  /** tool definitions rendered by the chat template (messages only) */
  tools?: unknown[];
  ids?: number[];
}

/**
 * A message's text (text parts joined; none for null content).
 * @param m the message
 * @returns its text
 */
export function messageText(m: ChatMessage): string {
  if (m.content == null) return "";
  return typeof m.content === "string" ? m.content : m.content.map((p) => p.text).join("");
}

/**
 * Text of chat messages through the tier's chat template (with the generation prompt).
 * @param tier the tier
 * @param messages validated messages
 * @param tools tool definitions for the template's tool section (none: no section)
 * @returns the prompt text
 */
export function chatPrompt(tier: Tier, messages: ChatMessage[], tools?: unknown[]): string {
  return tier.model.tokenizer.applyChatTemplate(
    messages.map((m) => ({
      role: m.role === "developer" ? "system" : m.role,
      content: messageText(m),
      ...(m.tool_calls ? { tool_calls: m.tool_calls } : {}),
      ...(m.tool_call_id !== undefined ? { tool_call_id: m.tool_call_id } : {}),
    })),
    { addGenerationPrompt: true, tools },
  );
}

/** The characters a message adds to the prompt beyond its text (its calls' names and
 *  arguments). */
function callChars(m: ChatMessage): number {
  return (m.tool_calls ?? []).reduce(
    (n, c) => n + c.function.name.length + c.function.arguments.length,
    0,
  );
}

/** Slack for normalizers that shorten text before it is split (NFC composes up to 3 code
 *  points of Hangul jamo into one syllable; lowercasing and stripping only shorten less). */
const NORMALIZE_SLACK = 4;

/**
 * Refuses, without tokenizing, a text that cannot fit in `maxTokens` tokens: every token covers
 * at most `tokenizer.maxTokenChars` UTF-16 units of (normalized) text, so a text longer than
 * maxTokens × maxTokenChars × slack needs more than maxTokens tokens.
 * @param tier the tier (its tokenizer and max_context)
 * @param chars the text's length in UTF-16 units
 * @param param the request field to blame
 * @throws {InputError} context_length_exceeded
 */
export function checkTextBound(tier: Tier, chars: number, param: string): void {
  const limit = tier.config.max_context;
  const per = tier.model.tokenizer.maxTokenChars;
  if (chars <= limit * per * NORMALIZE_SLACK) return;
  throw new InputError(
    `${param} has ${chars} characters, more than tier "${tier.name}"'s max_context of ${limit} tokens can hold (a token covers at most ${per} characters)`,
    param,
    "context_length_exceeded",
  );
}

/**
 * The characters a prompt's text holds (messages: the sum of their texts).
 * @param p the prompt
 * @returns UTF-16 length
 */
export function promptChars(p: PromptInput): number {
  if (p.text !== undefined) return p.text.length;
  if (p.messages) {
    const tools = p.tools && p.tools.length > 0 ? JSON.stringify(p.tools).length : 0;
    return p.messages.reduce((n, m) => n + messageText(m).length + callChars(m), tools);
  }
  return 0;
}

/**
 * Token ids of a prompt given as text, chat messages or ids; text is bounded by the tier's
 * context before tokenizing and long text is tokenized off the event loop.
 * @param tier the tier (its tokenizer)
 * @param p exactly one of text, messages, ids
 * @param param request field quoted in errors
 * @returns ids (≥ 1)
 * @throws {InputError} for an empty encoding, an id outside the vocabulary, or a text that
 *   cannot fit the context
 */
export async function promptIds(tier: Tier, p: PromptInput, param = "prompt"): Promise<number[]> {
  checkTextBound(tier, promptChars(p), param);
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
    ids = await tier.model.tokenizer.encodeAsync(chatPrompt(tier, p.messages, p.tools));
  } else {
    ids = await tier.model.tokenizer.encodeAsync(p.text ?? "");
  }
  if (ids.length === 0) throw new InputError("prompt encodes to 0 tokens", param);
  return ids;
}
