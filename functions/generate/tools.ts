// Tool calling on /v1/chat/completions: the OpenAI request fields (`tools`, `tool_choice`,
// `parallel_tool_calls`, tool results and assistant tool calls in the history), the grammar of
// the output's calls, and the parsing of the model's output into OpenAI `tool_calls` — whole, or
// as stream deltas. The call format is the Hermes/Qwen one the demo models' chat template shows
// (models/README.md): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, calls
// separated by a newline. `required` or a named function: the output is calls only; `auto`: free
// text, but once the model opens a call the rest of it must be a call of one of the tools (its
// arguments following the tool's schema), closed. With `none` the tools are not rendered at all.
import { z } from "zod";
import { InputError, type Tier } from "../../lib/serve/mod.ts";
import type { StructuredOutput } from "./structured.ts";

/** The text a call opens and closes with (see the chat template in models/). */
export const TOOL_CALL_OPEN = "<tool_call>\n";
export const TOOL_CALL_CLOSE = "\n</tool_call>";
const OPEN_TAG = "<tool_call>";
const CLOSE_TAG = "</tool_call>";
/** The grammar's view of the same format. */
const SYNTAX = {
  trigger: OPEN_TAG,
  open: TOOL_CALL_OPEN,
  close: TOOL_CALL_CLOSE,
  separator: "\n",
} as const;

/** OpenAI's rule for function names. */
const functionName = z.string().regex(
  /^[A-Za-z0-9_-]{1,64}$/,
  "must be 1 to 64 of a-z, A-Z, 0-9, _ and -",
);

/** One entry of `tools`. */
export const toolSchema = z.strictObject({
  type: z.literal("function"),
  function: z.strictObject({
    name: functionName,
    description: z.string().optional(),
    parameters: z.record(z.string(), z.unknown()).optional(),
    strict: z.boolean().nullish(),
  }),
});

/** `tool_choice`. */
export const toolChoiceSchema = z.union([
  z.enum(["none", "auto", "required"]),
  z.strictObject({
    type: z.literal("function"),
    function: z.strictObject({ name: functionName }),
  }),
], {
  error: 'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
}).nullish();

const textParts = z.array(z.object({ type: z.literal("text"), text: z.string() }));
const content = z.union([z.string(), textParts], {
  error: 'must be a string or an array of {"type": "text", "text": string} parts',
});

/** An assistant message's call (arguments: a JSON string, as OpenAI sends it). */
const toolCallSchema = z.strictObject({
  id: z.string().min(1),
  type: z.literal("function"),
  function: z.strictObject({
    name: functionName,
    arguments: z.string().refine((s) => {
      try {
        JSON.parse(s);
        return true;
      } catch {
        return false;
      }
    }, "must be a JSON string"),
  }),
});

/** One chat message: OpenAI's roles; an assistant may carry tool_calls (content then may be
 *  null), a tool message answers one by tool_call_id. */
export const chatMessageSchema = z.object({
  role: z.enum(["system", "user", "assistant", "developer", "tool"]),
  content: content.nullish(),
  tool_calls: z.array(toolCallSchema).min(1).optional(),
  tool_call_id: z.string().min(1).optional(),
}).superRefine((m, ctx) => {
  if (m.content == null && !(m.role === "assistant" && m.tool_calls)) {
    ctx.addIssue({
      code: "custom",
      path: ["content"],
      message: m.role === "assistant"
        ? "an assistant message needs content or tool_calls"
        : 'must be a string or an array of {"type": "text", "text": string} parts',
    });
  }
  if (m.tool_calls && m.role !== "assistant") {
    ctx.addIssue({ code: "custom", path: ["tool_calls"], message: "only assistant messages" });
  }
  if (m.role === "tool" && m.tool_call_id === undefined) {
    ctx.addIssue({
      code: "custom",
      path: ["tool_call_id"],
      message: "a tool message needs the tool_call_id it answers",
    });
  }
});

/** `messages` of a chat request (≥ 1). */
export const chatMessagesSchema = z.array(chatMessageSchema).min(1);

export type ToolField = z.infer<typeof toolSchema>;
export type ToolChoiceField = z.infer<typeof toolChoiceSchema>;

/** A chat request's tool use, resolved. */
export interface ToolUse {
  /** what the template renders (the request's `tools`; empty with `none`) */
  rendered: ToolField[];
  /** the tools the output may call, by name */
  names: Set<string>;
  /** the output is calls only (required / a named function) */
  forced: boolean;
  /** several calls may follow one another (`parallel_tool_calls`, default true) */
  parallel: boolean;
  /** the function tool_choice names, if any */
  only?: string;
}

/**
 * Resolves `tools` and `tool_choice` (OpenAI: absent = auto when there are tools, none when
 * there are not).
 * @param tools the request's tools
 * @param choice the request's tool_choice
 * @param parallelCalls the request's parallel_tool_calls (absent = true)
 * @returns the tool use, or undefined when no tool is in play
 * @throws {InputError} naming `tools.<i>.function.name` for a repeated name, `tool_choice` for a
 *   choice without tools or naming no tool
 */
export function resolveTools(
  tools: ToolField[] | null | undefined,
  choice: ToolChoiceField,
  parallelCalls?: boolean | null,
): ToolUse | undefined {
  const parallel = parallelCalls ?? true;
  const list = tools ?? [];
  const names = new Set<string>();
  list.forEach((t, i) => {
    if (names.has(t.function.name)) {
      throw new InputError(
        `tools: the function name "${t.function.name}" is repeated`,
        `tools.${i}.function.name`,
      );
    }
    names.add(t.function.name);
  });
  if (choice == null || choice === "none") {
    if (choice === "none" || list.length === 0) return undefined;
    return { rendered: list, names, forced: false, parallel };
  }
  if (list.length === 0) {
    throw new InputError("tool_choice requires tools", "tool_choice");
  }
  if (choice === "auto") return { rendered: list, names, forced: false, parallel };
  if (choice === "required") return { rendered: list, names, forced: true, parallel };
  const only = choice.function.name;
  if (!names.has(only)) {
    throw new InputError(
      `tool_choice names the function "${only}", which is not in tools`,
      "tool_choice.function.name",
    );
  }
  return { rendered: list, names: new Set([only]), forced: true, parallel, only };
}

/**
 * The grammar of the output's calls, compiled for the tier: with `required` calls of any of the
 * tools, with a named function calls of it, with `auto` free text in which every call opened is
 * a call of one of the tools; one call at most when `parallel` is false. Undefined when no tool
 * is in play.
 * @param tier the tier the request runs on (its tokenizer, vocabulary and stop ids)
 * @param use the request's tool use
 * @returns the compiled call grammar, or undefined
 * @throws {InputError} naming `tools.<i>.function.parameters...` for a schema the engine cannot use
 */
export async function toolGrammar(
  tier: Tier,
  use: ToolUse | undefined,
): Promise<StructuredOutput | undefined> {
  if (!use) return undefined;
  const { GrammarEngine, GrammarInputError } = await import("../../lib/grammar/mod.ts");
  const m = tier.model;
  const engine = await GrammarEngine.forTokenizer(
    m.tokenizer,
    m.native.config.vocabSize,
    m.eosTokenIds,
  );
  // Error paths index `tools` as sent.
  const tools = use.rendered.map((t, i) => ({
    name: t.function.name,
    parameters: t.function.parameters ?? { type: "object" },
    param: `tools.${i}.function.parameters`,
  })).filter((t) => use.names.has(t.name));
  try {
    return await engine.compile({
      type: "tool_calls",
      tools,
      mode: use.forced ? "required" : "auto",
      parallel: use.parallel,
      syntax: SYNTAX,
    });
  } catch (e) {
    if (e instanceof GrammarInputError) throw new InputError(e.message, e.param);
    throw e;
  }
}

/** One call in the OpenAI shape. */
export interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/** A piece of streamed output: text, or part of a call (index: the call's position). */
export type ToolDelta =
  | { content: string }
  | {
    tool_calls: [{
      index: number;
      id?: string;
      type?: "function";
      function: { name?: string; arguments: string };
    }];
  };

function callId(): string {
  return `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
}

/** `{"name": "<n>", "arguments": ` at the start of a call's body, any spacing, up to the first
 *  character of the arguments (so a streamed head never ends inside the spacing). */
const HEAD = /^\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_-]{1,64})"\s*,\s*"arguments"\s*:\s*(?=\S)/;

/**
 * Parses a complete call body (between the tags) into its name and arguments' JSON text.
 * @returns undefined when it is not a call of a known tool with an object of arguments
 */
function parseCall(body: string, names: Set<string>): { name: string; args: string } | undefined {
  let v: unknown;
  try {
    v = JSON.parse(body);
  } catch {
    return undefined;
  }
  if (v === null || typeof v !== "object" || Array.isArray(v)) return undefined;
  const { name, arguments: args } = v as Record<string, unknown>;
  if (typeof name !== "string" || !names.has(name)) return undefined;
  if (args === null || typeof args !== "object" || Array.isArray(args)) return undefined;
  // The model's own text of the arguments when the body is laid out as the template shows it.
  const head = HEAD.exec(body);
  if (head && head[1] === name) {
    const raw = body.slice(head[0].length).replace(/\}\s*$/, "").trim();
    try {
      JSON.parse(raw);
      return { name, args: raw };
    } catch { /* another layout: re-serialize */ }
  }
  return { name, args: JSON.stringify(args) };
}

/** The longest tail of `s` that is a proper prefix of `tag`. */
function partialTag(s: string, tag: string): number {
  for (let n = Math.min(tag.length - 1, s.length); n > 0; n--) {
    if (s.endsWith(tag.slice(0, n))) return n;
  }
  return 0;
}

/**
 * Splits generated text into content and tool calls as it arrives. Outside a call block text is
 * content (a possible start of `<tool_call>` is held back); a block becomes a call when it
 * closes well-formed, else its text is content. When the calls' grammar constrains the output,
 * a call of a known tool is announced as soon as its name is generated and its arguments stream
 * as they come (the text after them is the fixed close, held back by its length); when it makes
 * the output calls only, the text between calls (their separator) is dropped.
 */
export class ToolCallParser {
  readonly #names: Set<string>;
  readonly #forced: boolean;
  readonly #early: boolean;
  #pending = "";
  #inBlock = false;
  #block = "";
  /** forced calls: the open call's arguments sent so far, once its head is sent */
  #sent: number | undefined;
  #headLength = 0;
  readonly calls: ToolCall[] = [];

  /**
   * @param use the request's tool use
   * @param constrained whether the calls' grammar constrains the output (with `auto` it does not
   *   when a response_format takes precedence); default: for required and named calls
   */
  constructor(use: ToolUse, constrained = use.forced) {
    this.#names = use.names;
    this.#forced = use.forced;
    this.#early = constrained;
  }

  /**
   * Takes the next piece of text.
   * @returns the deltas it completes
   */
  push(text: string): ToolDelta[] {
    const out: ToolDelta[] = [];
    this.#pending += text;
    for (;;) {
      if (!this.#inBlock) {
        const at = this.#pending.indexOf(OPEN_TAG);
        if (at < 0) {
          const keep = partialTag(this.#pending, OPEN_TAG);
          const emit = this.#pending.slice(0, this.#pending.length - keep);
          if (emit !== "" && !this.#forced) out.push({ content: emit });
          this.#pending = this.#pending.slice(emit.length);
          return out;
        }
        if (at > 0 && !this.#forced) out.push({ content: this.#pending.slice(0, at) });
        this.#pending = this.#pending.slice(at + OPEN_TAG.length);
        this.#inBlock = true;
        this.#block = "";
        this.#sent = undefined;
      }
      this.#block += this.#pending;
      this.#pending = "";
      const end = this.#block.indexOf(CLOSE_TAG);
      if (end < 0) {
        if (this.#early) this.#streamArgs(out);
        return out;
      }
      this.#pending = this.#block.slice(end + CLOSE_TAG.length);
      this.#block = this.#block.slice(0, end);
      this.#closeBlock(out);
    }
  }

  /**
   * Ends the text (a block still open is content, or a call cut short when its head was sent).
   * @returns the last deltas
   */
  end(): ToolDelta[] {
    const out: ToolDelta[] = [];
    if (this.#inBlock) {
      if (this.#sent !== undefined) {
        const rest = this.#block.slice(this.#headLength + this.#sent);
        if (rest !== "") out.push(this.#argsDelta(rest));
        this.calls[this.calls.length - 1].function.arguments += rest;
      } else {
        out.push({ content: OPEN_TAG + this.#block });
      }
      this.#inBlock = false;
    } else if (this.#pending !== "" && !this.#forced) {
      out.push({ content: this.#pending });
    }
    this.#pending = "";
    return out;
  }

  #argsDelta(args: string): ToolDelta {
    return { tool_calls: [{ index: this.calls.length - 1, function: { arguments: args } }] };
  }

  #head(out: ToolDelta[], name: string): void {
    const call: ToolCall = { id: callId(), type: "function", function: { name, arguments: "" } };
    this.calls.push(call);
    out.push({
      tool_calls: [{
        index: this.calls.length - 1,
        id: call.id,
        type: "function",
        function: { name, arguments: "" },
      }],
    });
  }

  /** Constrained call: sends the head once complete, then the arguments but the close's length. */
  #streamArgs(out: ToolDelta[]): void {
    if (this.#sent === undefined) {
      const head = HEAD.exec(this.#block);
      if (!head || !this.#names.has(head[1])) return;
      this.#head(out, head[1]);
      this.#headLength = head[0].length;
      this.#sent = 0;
    }
    // What follows the arguments: "}" and the close ("\n</tool_call>").
    const hold = 1 + TOOL_CALL_CLOSE.length;
    const ready = this.#block.length - this.#headLength - hold;
    if (ready > this.#sent) {
      const piece = this.#block.slice(this.#headLength + this.#sent, this.#headLength + ready);
      this.#sent = ready;
      this.calls[this.calls.length - 1].function.arguments += piece;
      out.push(this.#argsDelta(piece));
    }
  }

  #closeBlock(out: ToolDelta[]): void {
    this.#inBlock = false;
    const call = parseCall(this.#block, this.#names);
    if (this.#sent !== undefined) {
      // Head and part of the arguments are out: send the rest of the model's text.
      const open = this.calls[this.calls.length - 1];
      const full = call?.args ?? this.#block.slice(this.#headLength).replace(/\}\s*$/, "");
      const rest = full.slice(open.function.arguments.length);
      if (rest !== "") {
        open.function.arguments += rest;
        out.push(this.#argsDelta(rest));
      }
      return;
    }
    if (!call) {
      out.push({ content: OPEN_TAG + this.#block + CLOSE_TAG });
      return;
    }
    this.#head(out, call.name);
    this.calls[this.calls.length - 1].function.arguments = call.args;
    out.push(this.#argsDelta(call.args));
  }
}

/**
 * A whole output as an OpenAI message: the calls it holds and the rest as content (null when
 * only calls and spacing).
 * @param use the request's tool use
 * @param text the generated text
 * @returns content and tool_calls (absent when none)
 */
export function parseToolOutput(
  use: ToolUse,
  text: string,
): { content: string | null; tool_calls?: ToolCall[] } {
  const p = new ToolCallParser(use);
  const parts = [...p.push(text), ...p.end()];
  const content = parts.map((d) => "content" in d ? d.content : "").join("");
  if (p.calls.length === 0) return { content };
  return { content: content.trim() === "" ? null : content, tool_calls: p.calls };
}
