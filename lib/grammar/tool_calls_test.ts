// Tests of the tool-call grammar (lib/grammar, XGrammar structural tags) below HTTP. Tokens are
// drawn by the native sampler under each step's mask from seeded random logits that strongly
// favour the next token of a "teacher" text — plain text, valid calls, calls with wrong argument
// types or unknown names, several calls, text around calls, a call opened and left as garbage —
// so the draw writes what the teacher writes wherever the grammar lets it. Every output is then
// split by an independent reader (this file's, not the server's parser) into text and calls:
// every `<tool_call>` opened must be a closed call of a known tool whose arguments validate with
// ajv against that tool's schema; `required` outputs are calls only; `parallel: false` gives one
// call at most (exactly one with `required`); a valid teacher is followed exactly.

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { GrammarEngine, type ToolCallMode } from "./mod.ts";
import { SCHEMAS } from "./test_schemas.ts";
import { closingBias, drawTeacher, EOS, tokenizer } from "./test_draw.ts";
const SYNTAX = {
  trigger: "<tool_call>",
  open: "<tool_call>\n",
  close: "\n</tool_call>",
  separator: "\n",
};

const WEATHER = {
  type: "object",
  properties: {
    city: { type: "string", enum: ["Paris", "Oslo", "Lima"] },
    days: { type: "integer", minimum: 0, maximum: 9 },
  },
  required: ["city", "days"],
  additionalProperties: false,
};
const TOOLS = [
  { name: "get_weather", parameters: WEATHER, param: "tools.0.function.parameters" },
  { name: "person", parameters: SCHEMAS.person, param: "tools.1.function.parameters" },
  { name: "nested", parameters: SCHEMAS.nested, param: "tools.2.function.parameters" },
];

const call = (name: string, args: string) =>
  `<tool_call>\n{"name": "${name}", "arguments": ${args}}\n</tool_call>`;
const W1 = call("get_weather", '{"city": "Oslo", "days": 3}');
const W2 = call("person", '{"name": "Ada", "age": 36}');

/** Teachers: the text, and the grammars that allow all of it ("auto" or "required", then "+"
 *  for parallel, "1" for one call at most). */
const ALL = ["auto+", "auto1", "required+", "required1"];
const TEACHERS: [string, string[]][] = [
  ["The weather is mild today, no tool needed.", ["auto+", "auto1"]],
  [W1, ALL],
  [`${W1}\n${W2}`, ["auto+", "required+"]],
  [`Let me look that up. ${W1}`, ["auto+", "auto1"]],
  [call("get_weather", '{"city": "Rome", "days": "three"}'), []],
  [call("get_weather", '{"city": "Oslo", "days": 3, "extra": true}'), []],
  [call("launch_rockets", '{"count": 3}'), []],
  ["<tool_call>\nI think I should call a tool here but I will ramble instead.", []],
  [`${W1} and then some trailing text`, ["auto+"]],
  ['{"name": "get_weather", "arguments": {"city": "Oslo"}}', ["auto+", "auto1"]],
];

/**
 * The independent reader: splits at every `<tool_call>`; each must open a closed call of a known
 * tool, `{"name": ..., "arguments": ...}` in that order, arguments valid for its schema.
 * @returns the text outside calls (as pieces) and the calls
 */
function readOutput(
  ajv: Ajv,
  text: string,
): { texts: string[]; calls: { name: string; arguments: unknown }[] } {
  const texts: string[] = [];
  const calls: { name: string; arguments: unknown }[] = [];
  let rest = text;
  for (;;) {
    const at = rest.indexOf(SYNTAX.trigger);
    if (at < 0) break;
    texts.push(rest.slice(0, at));
    rest = rest.slice(at);
    assert.ok(rest.startsWith(SYNTAX.open), `a call opened without its newline: ${text}`);
    const end = rest.indexOf(SYNTAX.close);
    assert.ok(end >= 0, `a call left open: ${JSON.stringify(text)}`);
    const body = JSON.parse(rest.slice(SYNTAX.open.length, end));
    assert.deepEqual(Object.keys(body), ["name", "arguments"], text);
    const tool = TOOLS.find((t) => t.name === body.name);
    assert.ok(tool, `a call of an unknown tool: ${text}`);
    const validate = ajv.compile(tool.parameters as object);
    assert.ok(validate(body.arguments), `${text}: ${JSON.stringify(validate.errors)}`);
    calls.push(body);
    rest = rest.slice(end + SYNTAX.close.length);
  }
  texts.push(rest);
  return { texts, calls };
}

async function engine(): Promise<GrammarEngine> {
  return await GrammarEngine.forTokenizer(await tokenizer(), 4096, [EOS]);
}

for (const mode of ["auto", "required"] as ToolCallMode[]) {
  for (const parallel of [true, false]) {
    Deno.test({
      name:
        `a ${mode} tool-call grammar (parallel ${parallel}) gives text or closed calls whose arguments validate with ajv, whatever the logits favour`,
      sanitizeOps: false,
      sanitizeResources: false,
      fn: async () => {
        const ajv = new Ajv({ strict: false });
        const eng = await engine();
        const bias = await closingBias();
        const compiled = await eng.compile({
          type: "tool_calls",
          tools: TOOLS,
          mode,
          parallel,
          syntax: SYNTAX,
        });
        let multi = 0, plain = 0;
        for (const [k, [teacher, allows]] of TEACHERS.entries()) {
          using matcher = await compiled.matcher();
          const text = await drawTeacher(matcher, teacher, 100 + k, bias);
          const { texts, calls } = readOutput(ajv, text);
          if (calls.length > 1) multi++;
          if (calls.length === 0) plain++;
          if (!parallel) assert.ok(calls.length <= 1, `${calls.length} calls: ${text}`);
          if (mode === "required") {
            assert.ok(calls.length >= 1, `no call: ${JSON.stringify(text)}`);
            assert.equal(texts[0], "", text);
            for (const t of texts.slice(1, -1)) assert.equal(t, SYNTAX.separator, text);
            assert.equal(texts[texts.length - 1], "", text);
          } else if (!parallel && calls.length === 1) {
            assert.equal(texts[1], "", `text after the only call: ${text}`);
          }
          // Where the grammar allows the teacher, the draw is the teacher.
          if (allows.includes(`${mode}${parallel ? "+" : "1"}`)) assert.equal(text, teacher);
        }
        if (parallel) assert.ok(multi > 0, "no output held several calls");
        assert.equal(plain > 0, mode === "auto", `${plain} outputs without a call`);
      },
    });
  }
}

Deno.test({
  name:
    "a tool's parameters may use a local $ref; no tools, or a $ref that names nothing, are refused",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const ajv = new Ajv({ strict: false });
    const eng = await engine();
    const bias = await closingBias();
    const withRef = {
      type: "object",
      properties: { p: { $ref: "#/$defs/point" } },
      required: ["p"],
      additionalProperties: false,
      $defs: {
        point: {
          type: "object",
          properties: { x: { type: "integer", minimum: 0, maximum: 9 } },
          required: ["x"],
          additionalProperties: false,
        },
      },
    };
    const tools = [{ name: "mark", parameters: withRef, param: "tools.0.function.parameters" }];
    const compiled = await eng.compile({
      type: "tool_calls",
      tools,
      mode: "required",
      parallel: false,
      syntax: SYNTAX,
    });
    using matcher = await compiled.matcher();
    const text = await drawTeacher(matcher, call("mark", '{"p": {"x": "a"}}'), 5, bias);
    const body = JSON.parse(text.slice(SYNTAX.open.length, -SYNTAX.close.length));
    assert.ok(ajv.validate(withRef, body.arguments), text);
    await assert.rejects(
      eng.compile({ type: "tool_calls", tools: [], mode: "auto", parallel: true, syntax: SYNTAX }),
      (e) => e instanceof Error && "param" in e && e.param === "tools",
    );
    await assert.rejects(
      eng.compile({
        type: "tool_calls",
        tools: [TOOLS[0], {
          name: "f",
          parameters: { properties: { a: { $ref: "#/$defs/x" } } },
          param: "tools.1.function.parameters",
        }],
        mode: "auto",
        parallel: true,
        syntax: SYNTAX,
      }),
      (e) =>
        e instanceof Error && "param" in e &&
        e.param === "tools.1.function.parameters.properties.a.$ref",
    );
  },
});
