// response_format of /v1/chat/completions and /v1/completions: the OpenAI shapes ({type: "text"},
// {type: "json_object"}, {type: "json_schema", json_schema: {name, description?, schema?,
// strict?}}) and the per-request grammar matcher that restricts every draw to tokens keeping the
// output valid (lib/grammar, XGrammar). lib/grammar is imported on the first structured request
// only, so serving without one never loads XGrammar. A schema it cannot compile is a 400 naming
// the schema path. The output follows the schema whether or not `strict` is set.
import { z } from "zod";
import type { TokenGrammar } from "../../lib/engine/mod.ts";
import { InputError, type Tier } from "../../lib/serve/mod.ts";

/** The request field (both APIs). */
export const responseFormatSchema = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("text") }),
  z.strictObject({ type: z.literal("json_object") }),
  z.strictObject({
    type: z.literal("json_schema"),
    json_schema: z.strictObject({
      name: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, "must be 1 to 64 of a-z, A-Z, 0-9, _ and -"),
      description: z.string().optional(),
      schema: z.record(z.string(), z.unknown()).optional(),
      strict: z.boolean().nullish(),
    }),
  }),
], { error: 'must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", ...}' })
  .nullish();

export type ResponseFormatField = z.infer<typeof responseFormatSchema>;

/** A compiled response format: a fresh grammar matcher per generation. */
export interface StructuredOutput {
  matcher(): Promise<TokenGrammar>;
}

/**
 * Compiles a structured request's response_format for a tier (undefined for text). Compiled
 * grammars are cached per tokenizer and canonical schema (lib/grammar), so a repeated schema
 * costs a lookup. Called while planning, so a bad schema is a 400 before anything runs.
 * @param tier the tier the request runs on (its tokenizer, vocabulary and stop ids)
 * @param rf the request's response_format
 * @returns the compiled format, or undefined for text
 * @throws {InputError} naming `response_format.json_schema.schema...` for a schema it cannot use
 */
export async function structuredOutput(
  tier: Tier,
  rf: ResponseFormatField,
): Promise<StructuredOutput | undefined> {
  if (rf == null || rf.type === "text") return undefined;
  const { GrammarEngine, GrammarInputError } = await import("../../lib/grammar/mod.ts");
  const m = tier.model;
  const engine = await GrammarEngine.forTokenizer(
    m.tokenizer,
    m.native.config.vocabSize,
    m.eosTokenIds,
  );
  try {
    return rf.type === "json_schema" && rf.json_schema.schema !== undefined
      ? await engine.compile({ type: "json_schema", schema: rf.json_schema.schema })
      : await engine.compile({ type: "json_object" });
  } catch (e) {
    if (e instanceof GrammarInputError) throw new InputError(e.message, e.param);
    throw e;
  }
}
