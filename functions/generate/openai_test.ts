// OpenAI semantics through the official `openai` npm client (its fetch routed into the Hono app):
// logprobs/top_logprobs for chat and completions, streaming too, against the prefill logits'
// log-softmax; logit_bias, penalties and seed against lib/engine generate(); every known field
// validated with a 400 naming `param`; unsupported features and unknown fields refused.
import assert from "node:assert/strict";
import OpenAI from "openai";
import { generate } from "../../lib/engine/mod.ts";
import type { Runtime } from "../../lib/serve/mod.ts";
import { testRuntime } from "../shared/test_helpers.ts";
import { client } from "./openai_client.ts";

/** log-softmax of the logits after `prompt` (float64), over the tokenizer's vocabulary. */
async function firstLogprobs(rt: Runtime, ids: number[]): Promise<Float64Array> {
  const model = rt.tiers.get("fast")!.model;
  const seq = model.native.createSequence(ids.length);
  try {
    const logits = await seq.prefill(ids);
    const w = model.tokenizer.vocabSize;
    let max = -Infinity;
    for (let i = 0; i < w; i++) max = Math.max(max, logits[i]);
    let sum = 0;
    for (let i = 0; i < w; i++) sum += Math.exp(logits[i] - max);
    const out = new Float64Array(w);
    for (let i = 0; i < w; i++) out[i] = logits[i] - max - Math.log(sum);
    return out;
  } finally {
    seq.free();
  }
}

const prompt = "The old lighthouse stood at the edge of the";

Deno.test("chat logprobs/top_logprobs (plain and streamed) equal the model's log-softmax", async () => {
  const rt = await testRuntime();
  try {
    const ai = client(rt);
    const messages = [{ role: "user" as const, content: prompt }];
    const r = await ai.chat.completions.create({
      model: "fast",
      messages,
      max_tokens: 4,
      temperature: 0,
      logprobs: true,
      top_logprobs: 3,
    });
    const content = r.choices[0].logprobs!.content!;
    assert.equal(content.length, r.usage!.completion_tokens);
    assert.equal(content.map((c) => c.token).join(""), r.choices[0].message.content);
    for (const c of content) {
      assert.equal(c.top_logprobs.length, 3);
      assert.equal(c.top_logprobs[0].token, c.token, "greedy picks the top token");
      assert.deepEqual(c.bytes, [...new TextEncoder().encode(c.token)]);
    }
    const tier = rt.tiers.get("fast")!;
    const ids = tier.model.tokenizer.encode(
      tier.model.tokenizer.applyChatTemplate(messages, { addGenerationPrompt: true }),
    );
    const ref = await firstLogprobs(rt, ids);
    const firstId = tier.model.tokenizer.encode(content[0].token)[0];
    assert.ok(Math.abs(content[0].logprob - ref[firstId]) < 1e-4);
    const stream = await ai.chat.completions.create({
      model: "fast",
      messages,
      max_tokens: 4,
      temperature: 0,
      logprobs: true,
      top_logprobs: 2,
      stream: true,
    });
    const streamed = [];
    for await (const chunk of stream) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
    assert.deepEqual(streamed.map((c) => c.token), content.map((c) => c.token));
    // The streamed request reuses the plain one's prefix-cache chunk (16 tokens) and prefills
    // the other 7: a 7-row GEMM takes the AVX-512 tiles where the 23-row prefill took AMX
    // (docs/gemm.md), 1e-7-level differences that reach ~1e-6 in a logprob (bit-equal with
    // the avx512 kernel cap, cpuKernel).
    for (const [i, c] of streamed.entries()) {
      assert.ok(Math.abs(c.logprob - content[i].logprob) < 1e-5);
      assert.equal(c.top_logprobs.length, 2);
    }
    const none = await ai.chat.completions.create({ model: "fast", messages, max_tokens: 2 });
    assert.equal(none.choices[0].logprobs, null);
  } finally {
    await rt.close();
  }
});

Deno.test("completions logprobs (plain and streamed) list tokens, logprobs, top alternatives, offsets", async () => {
  const rt = await testRuntime();
  try {
    const ai = client(rt);
    const r = await ai.completions.create({
      model: "fast",
      prompt,
      max_tokens: 4,
      temperature: 0,
      logprobs: 2,
    });
    const lp = r.choices[0].logprobs!;
    assert.equal(lp.tokens!.length, r.usage!.completion_tokens);
    assert.equal(lp.tokens!.join(""), r.choices[0].text);
    assert.equal(lp.text_offset![0], 0);
    for (const top of lp.top_logprobs!) assert.ok(Object.keys(top).length <= 2);
    const ids = rt.tiers.get("fast")!.model.tokenizer.encode(prompt);
    const ref = await firstLogprobs(rt, ids);
    const firstId = rt.tiers.get("fast")!.model.tokenizer.encode(lp.tokens![0])[0];
    assert.ok(Math.abs(lp.token_logprobs![0] - ref[firstId]) < 1e-4);
    const stream = await ai.completions.create({
      model: "fast",
      prompt,
      max_tokens: 4,
      temperature: 0,
      logprobs: 2,
      stream: true,
    });
    const tokens: string[] = [];
    for await (const chunk of stream) tokens.push(...(chunk.choices[0]?.logprobs?.tokens ?? []));
    assert.deepEqual(tokens, lp.tokens);
  } finally {
    await rt.close();
  }
});

Deno.test("logit_bias, presence/frequency penalties and seed reach the sampler like generate()", async () => {
  const rt = await testRuntime();
  try {
    const ai = client(rt);
    const model = rt.tiers.get("fast")!.model;
    const plain = await generate(model, prompt, { maxTokens: 6, temperature: 0 });
    const forced = plain.tokenIds[0] === 11 ? 12 : 11;
    const biased = await ai.completions.create({
      model: "fast",
      prompt,
      max_tokens: 3,
      temperature: 0,
      logit_bias: { [String(forced)]: 100 },
    });
    assert.equal(biased.choices[0].text, model.tokenizer.decode([forced, forced, forced]));
    const penal = await ai.completions.create({
      model: "fast",
      prompt: "one two one two one two one two",
      max_tokens: 6,
      temperature: 0,
      frequency_penalty: 1.5,
      presence_penalty: 0.5,
    });
    const want = await generate(model, "one two one two one two one two", {
      maxTokens: 6,
      temperature: 0,
      frequencyPenalty: 1.5,
      presencePenalty: 0.5,
    });
    assert.equal(penal.choices[0].text, want.text);
    const seeded = async (seed: number) =>
      (await ai.completions.create({
        model: "fast",
        prompt,
        max_tokens: 8,
        temperature: 1,
        seed,
      })).choices[0].text;
    assert.equal(await seeded(7), await seeded(7));
    const ref = await generate(model, prompt, { maxTokens: 8, temperature: 1, seed: 7 });
    assert.equal(await seeded(7), ref.text);
  } finally {
    await rt.close();
  }
});

Deno.test("invalid known fields answer 400 naming param; unsupported features and unknown fields are refused", async () => {
  const rt = await testRuntime();
  try {
    const ai = client(rt);
    const messages = [{ role: "user" as const, content: "hi" }];
    const chat = (extra: Record<string, unknown>) =>
      ai.chat.completions.create({ model: "fast", messages, max_tokens: 1, ...extra } as never);
    const cmpl = (extra: Record<string, unknown>) =>
      ai.completions.create({ model: "fast", prompt: "hi", max_tokens: 1, ...extra } as never);
    const cases: [string, () => Promise<unknown>, string, RegExp?][] = [
      ["presence_penalty out of range", () => chat({ presence_penalty: 3 }), "presence_penalty"],
      [
        "frequency_penalty not a number",
        () => chat({ frequency_penalty: "x" }),
        "frequency_penalty",
      ],
      ["logprobs not a boolean (chat)", () => chat({ logprobs: 3 }), "logprobs"],
      ["top_logprobs over 20", () => chat({ logprobs: true, top_logprobs: 21 }), "top_logprobs"],
      ["top_logprobs without logprobs", () => chat({ top_logprobs: 2 }), "top_logprobs"],
      ["logit_bias value over 100", () => chat({ logit_bias: { "5": 101 } }), "logit_bias.5"],
      ["logit_bias key not an id", () => chat({ logit_bias: { abc: 1 } }), "logit_bias.abc"],
      [
        "logit_bias id outside the vocabulary",
        () => chat({ logit_bias: { "99999999": 1 } }),
        "logit_bias.99999999",
      ],
      ["completions logprobs over 5", () => cmpl({ logprobs: 6 }), "logprobs"],
      ["seed not an integer", () => cmpl({ seed: 1.5 }), "seed"],
      [
        "tools entry not a function",
        () => chat({ tools: [{ type: "web", function: { name: "f" } }] }),
        "tools.0.type",
      ],
      ["tool_choice without tools", () => chat({ tool_choice: "required" }), "tool_choice"],
      [
        "legacy functions",
        () => chat({ functions: [{ name: "f" }] }),
        "functions",
        /not supported/,
      ],
      [
        "response_format json_schema without a name",
        () => chat({ response_format: { type: "json_schema", json_schema: { schema: {} } } }),
        "response_format.json_schema.name",
      ],
      [
        "response_format json_schema the engine cannot compile",
        () =>
          chat({
            response_format: {
              type: "json_schema",
              json_schema: {
                name: "x",
                schema: { type: "object", properties: { a: { type: "foo" } } },
              },
            },
          }),
        "response_format.json_schema.schema.properties.a.type",
        /unsupported type "foo"/,
      ],
      [
        "response_format of an unknown type",
        () => cmpl({ response_format: { type: "xml" } }),
        "response_format.type",
      ],
      ["n beyond the choice limit", () => chat({ n: 17 }), "n", /at most 16/],
      ["best_of below n", () => cmpl({ n: 2, best_of: 1 }), "best_of", /at least n/],
      ["suffix", () => cmpl({ suffix: "end" }), "suffix", /not supported/],
      ["echo", () => cmpl({ echo: true }), "echo", /not supported/],
      [
        "unknown field",
        () => chat({ frobnicate: 1 }),
        "frobnicate",
        /Unrecognized request argument/,
      ],
    ];
    for (const [what, call, param, message] of cases) {
      try {
        await call();
        assert.fail(`${what}: no error`);
      } catch (e) {
        if (!(e instanceof OpenAI.APIError)) throw e;
        assert.equal(e.status, 400, what);
        assert.equal(e.param, param, what);
        if (message) assert.match(e.message, message, what);
      }
    }
    // Accepted and ignored, as documented: user, metadata, store, service_tier, text format.
    const ok = await chat({
      user: "u1",
      metadata: { k: "v" },
      store: false,
      response_format: { type: "text" },
      tool_choice: "none",
    });
    assert.equal((ok as { object: string }).object, "chat.completion");
  } finally {
    await rt.close();
  }
});
