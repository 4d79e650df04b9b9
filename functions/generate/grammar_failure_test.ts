// A schema that aborts XGrammar's WebAssembly build, sent over HTTP through the official `openai`
// client: it passes the schema pre-check (a Unicode property class in a pattern), so only the
// engine can refuse it. The request gets a 400 naming the field — as response_format and as a
// tool's parameters under tool_choice "auto" — and the server goes on answering structured and
// tool requests correctly (outputs validated with ajv), every time it is sent.
import assert from "node:assert/strict";
import OpenAI from "openai";
import type { ChatCompletion } from "openai/resources/chat/completions";
import { Ajv } from "ajv";
import type { Runtime } from "../../lib/serve/mod.ts";
import { testRuntime } from "../shared/test_helpers.ts";
import { client } from "./openai_client.ts";

function runtime(): Promise<Runtime> {
  return testRuntime({
    tiers: { fast: "tiny-fast" },
    tier: { max_context: 2048, max_new_tokens: 256, concurrency: 2, queue_depth: 16 },
  });
}

/** Passes schema_check.ts; XGrammar aborts on `\p{...}`. */
const ABORTING = {
  type: "object",
  properties: { word: { type: "string", pattern: "\\p{L}+" } },
  required: ["word"],
};
const GOOD = {
  type: "object",
  properties: {
    color: { enum: ["red", "green", "blue"] },
    level: { type: "integer", minimum: 0, maximum: 9 },
  },
  required: ["color", "level"],
  additionalProperties: false,
};
const QUESTION = { role: "user" as const, content: "Pick a color." };

async function refused(p: Promise<unknown>, param: string): Promise<void> {
  try {
    await p;
    assert.fail(`accepted; expected a 400 naming ${param}`);
  } catch (e) {
    if (!(e instanceof OpenAI.APIError)) throw e;
    assert.equal(e.status, 400, e.message);
    assert.equal(e.param, param, e.message);
    assert.match(e.message, /cannot compile this schema/);
  }
}

Deno.test({
  name:
    "a schema that aborts the grammar engine is a 400 naming its field, and the next structured and tool requests are answered correctly",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const rt = await runtime();
    const ajv = new Ajv({ strict: false });
    const validate = ajv.compile(GOOD);
    try {
      const ai = client(rt);
      for (let round = 0; round < 2; round++) {
        await refused(
          ai.chat.completions.create({
            model: "fast",
            messages: [QUESTION],
            max_tokens: 64,
            response_format: {
              type: "json_schema",
              json_schema: { name: "bad", schema: ABORTING, strict: true },
            },
          }),
          "response_format.json_schema.schema",
        );
        for (const stream of [false, true]) {
          const common = {
            model: "fast",
            messages: [QUESTION],
            max_tokens: 64,
            seed: 3 + round,
            response_format: {
              type: "json_schema" as const,
              json_schema: { name: `good_${round}`, schema: GOOD, strict: true },
            },
          };
          const r: ChatCompletion = stream
            ? await ai.chat.completions.stream(common).finalChatCompletion()
            : await ai.chat.completions.create(common);
          const text = r.choices[0].message.content ?? "";
          assert.equal(r.choices[0].finish_reason, "stop", text);
          assert.ok(validate(JSON.parse(text)), `${text}: ${JSON.stringify(validate.errors)}`);
        }
        // Under "auto" the tools' grammar is compiled too: a tool's aborting schema is refused.
        const tools = [
          { type: "function" as const, function: { name: "pick", parameters: GOOD } },
          { type: "function" as const, function: { name: "spell", parameters: ABORTING } },
        ];
        await refused(
          ai.chat.completions.create({
            model: "fast",
            messages: [QUESTION],
            max_tokens: 32,
            tools,
            tool_choice: "auto",
          }),
          "tools.1.function.parameters",
        );
        const r = await ai.chat.completions.create({
          model: "fast",
          messages: [QUESTION],
          max_tokens: 128,
          seed: 5 + round,
          tools: tools.slice(0, 1),
          tool_choice: "required",
          parallel_tool_calls: false,
        });
        const calls = r.choices[0].message.tool_calls ?? [];
        assert.equal(calls.length, 1, JSON.stringify(r.choices[0].message));
        const call = calls[0] as { function: { name: string; arguments: string } };
        assert.equal(call.function.name, "pick");
        assert.ok(validate(JSON.parse(call.function.arguments)), call.function.arguments);
      }
    } finally {
      await rt.close();
    }
  },
});
