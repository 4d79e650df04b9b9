// Public face of lib/grammar: structured output (response_format) and tool calls compiled with
// XGrammar into a per-request matcher whose token masks the native sampler applies. Import it
// lazily (await import) where a request asks for structured output: loading it loads nothing of
// XGrammar itself until the first compile, but keeps its code out of plain serving.

export {
  CompiledFormat,
  GrammarEngine,
  GrammarInputError,
  GrammarMatcher,
  GrammarUnavailableError,
  type ResponseFormat,
  type ToolCallMode,
  type ToolCallSyntax,
  type ToolSpec,
} from "./xgrammar.ts";
export { checkSchema } from "./schema_check.ts";
export { probeWorkersStarted } from "./probe.ts";
