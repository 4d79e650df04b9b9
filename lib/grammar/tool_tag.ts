// The grammar of tool calls as an XGrammar structural tag: each tool a tag
// `<open>{"name": "<name>", "arguments": <arguments>}<close>` whose arguments follow that tool's
// schema (its EBNF, converted with compact ", " / ": " spacing and no indent, the layout chat
// templates show models). `auto`: free text in which every opening of a call (the trigger) must
// go on as one of the tags; `required`: one or more tags and nothing else, separated by the
// separator. With `parallel` false at most one call, after which the output ends.

/** How a chat template writes a call (the demo models': Hermes/Qwen). */
export interface ToolCallSyntax {
  /** text that starts a call in free text, e.g. "<tool_call>" */
  trigger: string;
  /** text before the call's JSON (starts with the trigger), e.g. "<tool_call>\n" */
  open: string;
  /** text after the call's JSON, e.g. "\n</tool_call>" */
  close: string;
  /** text between two calls, e.g. "\n" */
  separator: string;
}

/** `auto`: text or calls; `required`: calls only. */
export type ToolCallMode = "auto" | "required";

/**
 * The structural tag (JSON text) of calls of the given tools.
 * @param tools each tool's name and its arguments' grammar (EBNF with a `root` rule)
 * @param mode auto or required
 * @param parallel whether several calls may follow one another
 * @param syntax the call's text around its JSON
 * @returns the structural tag, as XGrammar's compileStructuralTag takes it
 */
export function toolCallTag(
  tools: { name: string; ebnf: string }[],
  mode: ToolCallMode,
  parallel: boolean,
  syntax: ToolCallSyntax,
): string {
  const tags = tools.map((t) => ({
    type: "tag",
    begin: `${syntax.open}{"name": ${JSON.stringify(t.name)}, "arguments": `,
    content: { type: "grammar", grammar: t.ebnf },
    end: `}${syntax.close}`,
  }));
  const format = mode === "auto"
    ? {
      type: "triggered_tags",
      triggers: [syntax.trigger],
      tags,
      at_least_one: false,
      stop_after_first: !parallel,
    }
    : {
      type: "tags_with_separator",
      tags,
      separator: syntax.separator,
      at_least_one: true,
      stop_after_first: !parallel,
    };
  return JSON.stringify({ type: "structural_tag", format });
}
