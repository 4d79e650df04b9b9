// Tool calling over HTTP through the official `openai` client (its fetch routed into the Hono
// app), on a demo tier: with tool_choice "required" and a named function the call's arguments
// parse and validate with ajv against the tool's parameters schema, and sending the result back
// as a `tool` message gets an answer — plain and streamed (the client's stream helper
// accumulates the deltas); "auto" gives text or a well-formed call; bad tool definitions are a
// 400 naming the field; a history with tool calls and results renders through the chat template.
import assert from "node:assert/strict";
import OpenAI from "openai";
import type {
  ChatCompletion,
  ChatCompletionCreateParamsStreaming,
  ChatCompletionMessageParam,
  ChatCompletionTool,
} from "openai/resources/chat/completions";
import { Ajv } from "ajv";
import { chatPrompt, type Runtime } from "../../lib/serve/mod.ts";
import { testRuntime } from "../shared/test_helpers.ts";
import { client } from "./openai_client.ts";
import { parseToolOutput, ToolCallParser, type ToolDelta } from "./tools.ts";

function runtime(): Promise<Runtime> {
  return testRuntime({
    tiers: { fast: "tiny-fast" },
    tier: { max_context: 2048, max_new_tokens: 256, concurrency: 2, queue_depth: 16 },
  });
}

const WEATHER = {
  type: "object",
  properties: {
    city: { type: "string", enum: ["Paris", "Oslo", "Lima"] },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] },
  },
  required: ["city", "unit"],
  additionalProperties: false,
};
const TIME = {
  type: "object",
  properties: { zone: { type: "string", enum: ["UTC", "CET"] }, exact: { type: "boolean" } },
  required: ["zone", "exact"],
  additionalProperties: false,
};
const TOOLS: ChatCompletionTool[] = [
  {
    type: "function",
    function: { name: "get_weather", description: "Weather in a city", parameters: WEATHER },
  },
  { type: "function", function: { name: "get_time", parameters: TIME } },
];
const SCHEMAS: Record<string, object> = { get_weather: WEATHER, get_time: TIME };
const QUESTION: ChatCompletionMessageParam = {
  role: "user",
  content: "What is the weather in Oslo?",
};

type Call = { id: string; type: "function"; function: { name: string; arguments: string } };

/** Asserts a call is well-formed: an id, a known name, arguments valid for its schema. */
function checkCall(ajv: Ajv, call: Call, names: string[]): void {
  assert.match(call.id, /^call_[A-Za-z0-9]+$/);
  assert.equal(call.type, "function");
  assert.ok(names.includes(call.function.name), `unexpected function ${call.function.name}`);
  let args: unknown;
  try {
    args = JSON.parse(call.function.arguments);
  } catch {
    assert.fail(`arguments are not JSON: ${call.function.arguments}`);
  }
  const validate = ajv.compile(SCHEMAS[call.function.name]);
  assert.ok(validate(args), `${call.function.arguments}: ${JSON.stringify(validate.errors)}`);
}

/** Sends the tool's result back and checks the model answers it in text. */
async function answer(ai: OpenAI, call: Call, stream: boolean): Promise<void> {
  const messages: ChatCompletionMessageParam[] = [
    QUESTION,
    { role: "assistant", content: null, tool_calls: [call] },
    { role: "tool", tool_call_id: call.id, content: '{"temperature": 4}' },
  ];
  const common = {
    model: "fast",
    messages,
    tools: TOOLS,
    tool_choice: "none" as const,
    max_tokens: 24,
    seed: 3,
  };
  const choice = stream
    ? (await ai.chat.completions.stream(common).finalChatCompletion()).choices[0]
    : (await ai.chat.completions.create(common)).choices[0];
  assert.ok(["stop", "length"].includes(choice.finish_reason), choice.finish_reason);
  assert.equal(typeof choice.message.content, "string");
  assert.equal(choice.message.tool_calls ?? undefined, undefined);
}

Deno.test({
  name:
    "required and named tool_choice give a call whose arguments validate, and the tool result gets an answer, plain and streamed",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const rt = await runtime();
    const ajv = new Ajv({ strict: false });
    try {
      const ai = client(rt);
      const names = ["get_weather", "get_time"];
      const named = { type: "function" as const, function: { name: "get_time" } };
      for (const [k, choice] of (["required", named] as const).entries()) {
        const allowed = choice === "required" ? names : ["get_time"];
        for (const stream of [false, true]) {
          const common = {
            model: "fast",
            messages: [QUESTION],
            tools: TOOLS,
            tool_choice: choice,
            parallel_tool_calls: false,
            max_tokens: 128,
            temperature: 0.8,
            seed: 7 + k,
          };
          const r: ChatCompletion = stream
            ? await ai.chat.completions.stream(common).finalChatCompletion()
            : await ai.chat.completions.create(common);
          const c = r.choices[0];
          assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c.message));
          assert.equal(c.message.content ?? null, null);
          assert.equal(c.message.tool_calls?.length, 1);
          const call = c.message.tool_calls![0] as Call;
          checkCall(ajv, call, allowed);
          await answer(ai, call, stream);
        }
      }
    } finally {
      await rt.close();
    }
  },
});

Deno.test({
  name: "a streamed forced call arrives as a head delta (id, name, empty arguments) then arguments",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const rt = await runtime();
    try {
      const ai = client(rt);
      const s = await ai.chat.completions.create({
        model: "fast",
        messages: [QUESTION],
        tools: TOOLS,
        tool_choice: "required",
        parallel_tool_calls: false,
        max_tokens: 128,
        seed: 1,
        stream: true,
      });
      const deltas = [];
      let finish: string | null = null;
      for await (const chunk of s) {
        const ch = chunk.choices[0];
        if (ch?.delta.tool_calls) deltas.push(...ch.delta.tool_calls);
        finish = ch?.finish_reason ?? finish;
      }
      assert.equal(finish, "tool_calls");
      assert.ok(deltas.length >= 2, JSON.stringify(deltas));
      const [head, ...rest] = deltas;
      assert.equal(head.index, 0);
      assert.match(head.id ?? "", /^call_/);
      assert.equal(head.type, "function");
      assert.equal(head.function?.arguments, "");
      for (const d of rest) {
        assert.equal(d.index, 0);
        assert.equal(d.id, undefined);
        assert.equal(d.function?.name, undefined);
      }
      JSON.parse(rest.map((d) => d.function?.arguments ?? "").join(""));
    } finally {
      await rt.close();
    }
  },
});

Deno.test({
  name: "auto answers with text or a well-formed call, plain and streamed",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const rt = await runtime();
    const ajv = new Ajv({ strict: false });
    try {
      const ai = client(rt);
      for (const seed of [1, 2, 3]) {
        for (const stream of [false, true]) {
          const common = {
            model: "fast",
            messages: [QUESTION],
            tools: TOOLS,
            tool_choice: "auto" as const,
            max_tokens: 48,
            seed,
          };
          const r: ChatCompletion = stream
            ? await ai.chat.completions.stream(common).finalChatCompletion()
            : await ai.chat.completions.create(common);
          const c = r.choices[0];
          if (c.message.tool_calls?.length) {
            assert.equal(c.finish_reason, "tool_calls");
            for (const call of c.message.tool_calls) {
              checkCall(ajv, call as Call, Object.keys(SCHEMAS));
            }
          } else {
            assert.ok(["stop", "length"].includes(c.finish_reason));
            assert.equal(typeof c.message.content, "string");
          }
        }
      }
    } finally {
      await rt.close();
    }
  },
});

Deno.test({
  name:
    "parallel_tool_calls: a required or named output may hold several calls, each validating; false holds exactly one, plain and streamed",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const rt = await runtime();
    const ajv = new Ajv({ strict: false });
    try {
      const ai = client(rt);
      const eos = rt.tiers.get("fast")!.model.eosTokenIds[0];
      const named = { type: "function" as const, function: { name: "get_time" } };
      for (const choice of ["required", named] as const) {
        const allowed = choice === "required" ? Object.keys(SCHEMAS) : ["get_time"];
        for (const parallel of [true, false]) {
          for (const stream of [false, true]) {
            const common = {
              model: "fast",
              messages: [QUESTION],
              tools: TOOLS,
              tool_choice: choice,
              parallel_tool_calls: parallel,
              max_tokens: 256,
              seed: 11,
              // parallel: the stop token is banned past one call's length (min_tokens), then
              // favoured; one call: stopping is all but banned, yet the grammar ends the output.
              ...(parallel
                ? { min_tokens: 90, logit_bias: { [eos]: 10 } }
                : { logit_bias: { [eos]: -100 } }),
            };
            const r: ChatCompletion = stream
              ? await ai.chat.completions.stream(common).finalChatCompletion()
              : await ai.chat.completions.create(common);
            const c = r.choices[0];
            const what = `${JSON.stringify(choice)} parallel ${parallel} stream ${stream}`;
            assert.equal(c.finish_reason, "tool_calls", `${what}: ${JSON.stringify(c.message)}`);
            const calls = (c.message.tool_calls ?? []) as Call[];
            if (parallel) assert.ok(calls.length >= 2, `${what}: ${calls.length} calls`);
            else assert.equal(calls.length, 1, what);
            for (const call of calls) checkCall(ajv, call, allowed);
            assert.equal(new Set(calls.map((x) => x.id)).size, calls.length, "repeated call ids");
            assert.ok(!c.message.content, `${what}: content ${JSON.stringify(c.message.content)}`);
            if (parallel && !stream) {
              // The round trip: every call's result goes back, and the model answers in text.
              const messages: ChatCompletionMessageParam[] = [
                QUESTION,
                { role: "assistant", content: null, tool_calls: calls },
                ...calls.map((x, i) => ({
                  role: "tool" as const,
                  tool_call_id: x.id,
                  content: `{"result": ${i}}`,
                })),
              ];
              const next = await ai.chat.completions.create({
                model: "fast",
                messages,
                tools: TOOLS,
                tool_choice: "none",
                max_tokens: 16,
              });
              assert.equal(typeof next.choices[0].message.content, "string");
            }
          }
        }
      }
      // The raw stream: each call opens with its head (index, id, name), indices 0, 1, ...
      const s = await ai.chat.completions.create({
        model: "fast",
        messages: [QUESTION],
        tools: TOOLS,
        tool_choice: "required",
        max_tokens: 256,
        seed: 11,
        min_tokens: 90,
        logit_bias: { [eos]: 10 },
        stream: true,
      } as ChatCompletionCreateParamsStreaming);
      const heads: number[] = [];
      let last = -1;
      for await (const chunk of s) {
        for (const d of chunk.choices[0]?.delta.tool_calls ?? []) {
          assert.ok(d.index === last || d.index === last + 1, `index ${d.index} after ${last}`);
          if (d.index === last + 1) {
            assert.match(d.id ?? "", /^call_/);
            assert.ok(d.function?.name, JSON.stringify(d));
            heads.push(d.index);
            last = d.index;
          } else {
            assert.equal(d.id, undefined);
          }
        }
      }
      assert.ok(heads.length >= 2, `${heads.length} calls streamed`);
    } finally {
      await rt.close();
    }
  },
});

Deno.test({
  name: "bad tool definitions and choices are a 400 naming the field",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const rt = await runtime();
    try {
      const ai = client(rt);
      const fn = (f: Record<string, unknown>) => [{ type: "function", function: f }];
      const cases: [Record<string, unknown>, string][] = [
        [{ tools: fn({ name: "get weather" }) }, "tools.0.function.name"],
        [{ tools: [{ type: "code", function: { name: "x" } }] }, "tools.0.type"],
        [{ tools: fn({ name: "x", parameters: "{}" }) }, "tools.0.function.parameters"],
        [{ tools: [...TOOLS, TOOLS[0]] }, "tools.2.function.name"],
        [{ tools: TOOLS, tool_choice: "always" }, "tool_choice"],
        [{ tool_choice: "required" }, "tool_choice"],
        [
          { tools: TOOLS, tool_choice: { type: "function", function: { name: "nope" } } },
          "tool_choice.function.name",
        ],
        [
          {
            tools: fn({ name: "x", parameters: { type: "object", not: { type: "null" } } }),
            tool_choice: "required",
          },
          "tools.0.function.parameters.not",
        ],
        [
          {
            tools: [TOOLS[0], ...fn({ name: "y", parameters: { $ref: "#/$defs/a" } })],
            tool_choice: { type: "function", function: { name: "y" } },
          },
          "tools.1.function.parameters.$ref",
        ],
        [
          { tools: TOOLS, tool_choice: "required", response_format: { type: "json_object" } },
          "response_format",
        ],
        [
          {
            messages: [QUESTION, { role: "tool", content: "4" }],
          },
          "messages.1.tool_call_id",
        ],
        [
          {
            messages: [QUESTION, {
              role: "assistant",
              content: null,
              tool_calls: [{ id: "c", type: "function", function: { name: "x", arguments: "{" } }],
            }],
          },
          "messages.1.tool_calls.0.function.arguments",
        ],
      ];
      for (const [body, param] of cases) {
        try {
          // deno-lint-ignore no-explicit-any
          await ai.chat.completions.create({ model: "fast", messages: [QUESTION], ...body } as any);
          assert.fail(`accepted: ${JSON.stringify(body)}`);
        } catch (e) {
          if (!(e instanceof OpenAI.APIError)) throw e;
          assert.equal(e.status, 400, `${param}: ${e.message}`);
          assert.equal(e.param, param, e.message);
        }
      }
    } finally {
      await rt.close();
    }
  },
});

Deno.test({
  name: "tools and a history with calls and results render through the chat template",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const rt = await runtime();
    try {
      const tier = rt.tiers.get("fast")!;
      const call = {
        id: "call_1",
        type: "function" as const,
        function: { name: "get_weather", arguments: '{"city": "Oslo", "unit": "celsius"}' },
      };
      const text = chatPrompt(tier, [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Weather in Oslo?" },
        { role: "assistant", content: null, tool_calls: [call] },
        { role: "tool", tool_call_id: "call_1", content: "RESULT-4-DEGREES" },
      ], TOOLS);
      assert.ok(text.startsWith("<|im_start|>system\nBe brief.\n\n# Tools"), text);
      assert.ok(
        text.includes(
          '<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", ',
        ),
        text,
      );
      assert.ok(
        text.includes(
          '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call><|im_end|>\n',
        ),
        text,
      );
      assert.ok(
        text.includes(
          "<|im_start|>tool\n<tool_response>\nRESULT-4-DEGREES\n</tool_response><|im_end|>\n",
        ),
        text,
      );
      assert.ok(text.endsWith("<|im_start|>assistant\n"));
      // Without tools the template renders as it always has (cached prefixes stay valid).
      assert.equal(
        chatPrompt(tier, [{ role: "system", content: "S" }, { role: "user", content: "U" }]),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n",
      );
    } finally {
      await rt.close();
    }
  },
});

Deno.test("the parser's deltas, fed a token at a time, add up to the whole-text parse", () => {
  const use = { rendered: [], names: new Set(["f", "g"]), forced: false, parallel: true };
  const text =
    'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": [1, 2]}}\n</tool_call>\n<tool_call>\n{"name": "zz", "arguments": {}}\n</tool_call><tool_call>\n{"arguments": {"b": 1}, "name": "g"}\n</tool_call> <tool_ca';
  const whole = parseToolOutput(use, text);
  assert.deepEqual(whole.tool_calls?.map((c) => [c.function.name, c.function.arguments]), [
    ["f", '{"a": [1, 2]}'],
    ["g", '{"b":1}'],
  ]);
  assert.equal(
    whole.content,
    'Sure.\n\n<tool_call>\n{"name": "zz", "arguments": {}}\n</tool_call> <tool_ca',
  );
  // Calls only (required / named): the text between calls is their separator, not content (a
  // block that is no call, which the grammar rules out, stays content).
  const forcedWhole = parseToolOutput({ ...use, forced: true }, text);
  assert.equal(forcedWhole.content, '<tool_call>\n{"name": "zz", "arguments": {}}\n</tool_call>');
  for (const [forced, constrained] of [[false, false], [false, true], [true, true]]) {
    const p = new ToolCallParser({ ...use, forced }, constrained);
    const deltas: ToolDelta[] = [];
    for (const ch of text) deltas.push(...p.push(ch));
    deltas.push(...p.end());
    const content = deltas.map((d) => "content" in d ? d.content : "").join("");
    const args = ["", ""];
    for (const d of deltas) {
      if ("tool_calls" in d) args[d.tool_calls[0].index] += d.tool_calls[0].function.arguments;
    }
    const what = `forced ${forced} constrained ${constrained}`;
    assert.equal(content, forced ? forcedWhole.content : whole.content, what);
    assert.deepEqual(args, ['{"a": [1, 2]}', '{"b":1}'], what);
    // Constrained, the first call's arguments stream as generated (a piece per character fed);
    // else they come whole when its block closes (head, then one piece).
    const first = deltas.filter((d) => "tool_calls" in d && d.tool_calls[0].index === 0).length;
    if (constrained) assert.ok(first > 2, `${what}: ${first} deltas`);
    else assert.equal(first, 2, what);
  }
});
