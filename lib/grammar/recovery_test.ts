// Tests that a schema which aborts XGrammar's WebAssembly build cannot take structured output
// down. The schemas here pass schema_check.ts (a Unicode property class in a pattern, an
// impossible minProperties) yet abort the engine's converter. Through the probe worker: a 400-style
// GrammarInputError naming the field with the engine's message, a fresh worker afterwards, the
// server's instance untouched. With the probe skipped, the abort hits the server's instance: the
// request is refused the same way, the instance is replaced, and the next schema compiles and
// draws output that validates with ajv.

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { Tokenizer } from "../tokenizer/mod.ts";
import { NativeSampler } from "../native/mod.ts";
import { DEMO_DIRS } from "../native/test_helpers.ts";
import { Xoshiro128 } from "../engine/prng.ts";
import { checkSchema, GrammarEngine, GrammarInputError, probeWorkersStarted } from "./mod.ts";
import { SCHEMAS } from "./test_schemas.ts";

const EOS = 4093;
const P = "response_format.json_schema.schema";
/** Schemas the pre-check lets through and the engine aborts on. */
const ABORTING: unknown[] = [
  { type: "object", properties: { w: { type: "string", pattern: "\\p{L}+" } } },
  {
    type: "object",
    properties: { a: { type: "integer" } },
    minProperties: 3,
    additionalProperties: false,
  },
];

let tokenizerP: Promise<Tokenizer> | null = null;
function tokenizer(): Promise<Tokenizer> {
  return tokenizerP ??= Tokenizer.load(DEMO_DIRS[0]);
}

/** Draws one output of `schema` from seeded random logits and validates it with ajv. (Schemas
 *  here have no length-bounded strings: this XGrammar build's rule for those admits control
 *  characters, which JSON forbids unescaped.) */
async function drawValid(eng: GrammarEngine, schema: unknown, seed: number): Promise<void> {
  const tok = await tokenizer();
  const compiled = await eng.compile({ type: "json_schema", schema });
  using matcher = await compiled.matcher();
  using sampler = NativeSampler.create({ temperature: 1, topK: 0, topP: 1, minP: 0, seed });
  const rng = new Xoshiro128(seed);
  const logits = new Float32Array(tok.vocabSize);
  const out: number[] = [];
  for (let step = 0; step < 2000 && !matcher.terminated; step++) {
    sampler.setMask(await matcher.nextMask());
    for (let i = 0; i < logits.length; i++) logits[i] = (rng.nextFloat() - 0.5) * 8;
    logits[EOS] += 8;
    for (const c of ['"', "}", "]"]) logits[tok.encode(c)[0]] += 6;
    const t = sampler.sample(logits).token;
    assert.ok(matcher.accept(t));
    if (!matcher.terminated) out.push(t);
  }
  assert.ok(matcher.terminated, "no complete output");
  const text = tok.decode(out);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new Error(`${JSON.stringify(text)} ${JSON.stringify(out)}: ${(e as Error).message}`);
  }
  assert.ok(new Ajv({ strict: false }).validate(schema as object, value), text);
}

async function engine(): Promise<GrammarEngine> {
  return await GrammarEngine.forTokenizer(await tokenizer(), 4096, [EOS]);
}

Deno.test({
  name:
    "compile() refuses a schema that aborts the engine, naming the field, in a worker it then replaces; the server's instance keeps serving",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    for (const schema of ABORTING) checkSchema(schema, P); // the pre-check does not catch them
    const eng = await engine();
    await drawValid(eng, SCHEMAS.numbers, 2); // a probe worker is running now
    for (const [k, schema] of ABORTING.entries()) {
      const started = probeWorkersStarted();
      await assert.rejects(
        eng.compile({ type: "json_schema", schema }),
        (e) =>
          e instanceof GrammarInputError && e.param === P &&
          e.message.startsWith(`${P}: the grammar engine cannot compile this schema: `) &&
          !e.message.includes("[FATAL]") && !e.message.includes(".cc:"),
      );
      // The next new grammar is built in a fresh worker; the engine is the same instance.
      await drawValid(eng, [SCHEMAS.enums, SCHEMAS.array_of_objects][k], 10 + k);
      assert.equal(probeWorkersStarted(), started + 1);
      assert.equal(await engine(), eng);
    }
    // The same holds for tools: the failing tool is named.
    await assert.rejects(
      eng.compile({
        type: "tool_calls",
        tools: [
          { name: "ok", parameters: SCHEMAS.enums, param: "tools.0.function.parameters" },
          { name: "bad", parameters: ABORTING[0], param: "tools.1.function.parameters" },
        ],
        mode: "auto",
        parallel: true,
        syntax: { trigger: "<t>", open: "<t>\n", close: "\n</t>", separator: "\n" },
      }),
      (e) => e instanceof GrammarInputError && e.param === "tools.1.function.parameters",
    );
    await drawValid(eng, SCHEMAS.const_and_bool, 3);
  },
});

Deno.test({
  name:
    "an abort on the server's instance (probe skipped) refuses that schema and replaces the instance: the next schema compiles and validates",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const before = await engine();
    await drawValid(before, SCHEMAS.enums, 1);
    for (const [k, schema] of ABORTING.entries()) {
      const eng = await engine();
      await assert.rejects(
        eng.compile({ type: "json_schema", schema }, P, { probe: false }),
        (e) => e instanceof GrammarInputError && e.param === P,
      );
      const next = await engine();
      assert.notEqual(next, eng, "the instance that aborted is still in use");
      await drawValid(next, SCHEMAS.numbers, 20 + k);
      await drawValid(next, SCHEMAS.array_of_objects, 30 + k);
    }
  },
});
