// Structured output over HTTP through the official `openai` client (its fetch routed into the Hono
// app): on each demo tier, for a dozen schemas, chat and completions, streamed and not, every
// output that ends with finish_reason "stop" parses and validates against its schema with ajv (an
// independent JSON Schema validator) — and all of them must end so; json_object gives a JSON
// object; chat.completions.parse with a zod schema (zodResponseFormat) returns the parsed
// object; a schema the engine cannot compile is a 400 naming its path.
import assert from "node:assert/strict";
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
import { Ajv } from "ajv";
import type { Runtime } from "../../lib/serve/mod.ts";
import { SCHEMAS } from "../../lib/grammar/test_schemas.ts";
import { testRuntime } from "../shared/test_helpers.ts";
import { client } from "./openai_client.ts";

const TIERS = { fast: "tiny-fast", balanced: "tiny-balanced", powerful: "tiny-powerful" };

function runtime(): Promise<Runtime> {
  return testRuntime({
    tiers: TIERS,
    tier: { max_context: 1024, max_new_tokens: 512, concurrency: 4, queue_depth: 64 },
  });
}

const format = (name: string, schema: unknown) => ({
  type: "json_schema" as const,
  json_schema: { name, schema: schema as Record<string, unknown>, strict: true },
});

Deno.test({
  name:
    "every json_schema output parses and validates with ajv on every demo tier, streamed and not",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const rt = await runtime();
    const ajv = new Ajv({ strict: false });
    try {
      const ai = client(rt);
      let checked = 0;
      for (const tier of Object.keys(TIERS)) {
        for (const [k, [name, schema]] of Object.entries(SCHEMAS).entries()) {
          const validate = ajv.compile(schema as object);
          const check = (text: string, finish: string | null, what: string) => {
            assert.equal(finish, "stop", `${what}: did not finish: ${text}`);
            let value: unknown;
            try {
              value = JSON.parse(text);
            } catch {
              assert.fail(`${what}: not JSON: ${text}`);
            }
            assert.ok(validate(value), `${what}: ${text}: ${JSON.stringify(validate.errors)}`);
            checked++;
          };
          const common = {
            model: tier,
            max_tokens: 500,
            temperature: 0.7,
            seed: 11 + k,
            response_format: format(name, schema),
          };
          // Chat, streamed on odd schemas and not on even ones; completions the other way round.
          const messages = [{ role: "user" as const, content: `Give me a ${name} as JSON.` }];
          if (k % 2 === 0) {
            const r = await ai.chat.completions.create({ ...common, messages });
            check(
              r.choices[0].message.content ?? "",
              r.choices[0].finish_reason,
              `${tier} chat ${name}`,
            );
            const s = await ai.completions.create({ ...common, prompt: "JSON: ", stream: true });
            let text = "", finish: string | null = null;
            for await (const ch of s) {
              text += ch.choices[0]?.text ?? "";
              finish = ch.choices[0]?.finish_reason ?? finish;
            }
            check(text, finish, `${tier} completions stream ${name}`);
          } else {
            const s = await ai.chat.completions.create({ ...common, messages, stream: true });
            let text = "", finish: string | null = null;
            for await (const ch of s) {
              text += ch.choices[0]?.delta?.content ?? "";
              finish = ch.choices[0]?.finish_reason ?? finish;
            }
            check(text, finish, `${tier} chat stream ${name}`);
            const r = await ai.completions.create({ ...common, prompt: "JSON: " });
            check(r.choices[0].text, r.choices[0].finish_reason, `${tier} completions ${name}`);
          }
        }
      }
      assert.equal(checked, Object.keys(TIERS).length * Object.keys(SCHEMAS).length * 2);
    } finally {
      await rt.close();
    }
  },
});

Deno.test({
  name: "json_object, chat.completions.parse with a zod schema, and an uncompilable schema's 400",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const rt = await runtime();
    try {
      const ai = client(rt);
      // json_object bounds nothing: a demo model may run on inside a string until max_tokens,
      // so each output must open an object, and one that ends must parse as an object.
      for (let seed = 1; seed <= 3; seed++) {
        const obj = await ai.chat.completions.create({
          model: "fast",
          messages: [{ role: "user", content: "an object please" }],
          max_tokens: 200,
          seed,
          response_format: { type: "json_object" },
        });
        const text = obj.choices[0].message.content!;
        assert.match(text, /^\s*\{/, text);
        if (obj.choices[0].finish_reason !== "stop") continue;
        const v = JSON.parse(text);
        assert.ok(v !== null && typeof v === "object" && !Array.isArray(v), text);
      }

      const Event = z.object({
        name: z.string().max(10),
        day: z.enum(["mon", "tue", "wed"]),
        guests: z.array(z.string().max(6)).min(1).max(3),
        confirmed: z.boolean(),
      });
      const parsed = await ai.chat.completions.parse({
        model: "fast",
        messages: [{ role: "user", content: "Describe an event." }],
        max_tokens: 500,
        seed: 4,
        response_format: zodResponseFormat(Event, "event"),
      });
      const event = parsed.choices[0].message.parsed;
      assert.ok(event, `no parsed object: ${parsed.choices[0].message.content}`);
      assert.deepEqual(Event.parse(event), event);

      try {
        await ai.chat.completions.create({
          model: "fast",
          messages: [{ role: "user", content: "x" }],
          response_format: format("bad", {
            type: "object",
            properties: { when: { type: "string", pattern: "(?<=a)b" } },
          }),
        });
        assert.fail("no error");
      } catch (e) {
        if (!(e instanceof OpenAI.APIError)) throw e;
        assert.equal(e.status, 400);
        assert.equal(e.param, "response_format.json_schema.schema.properties.when.pattern");
      }
    } finally {
      await rt.close();
    }
  },
});
