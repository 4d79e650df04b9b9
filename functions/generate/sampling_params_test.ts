// vLLM's sampling parameters on the OpenAI routes and /v1/generate (repetition_penalty,
// min_tokens, stop_token_ids, ignore_eos, top_k, min_p) and where sampling defaults come from:
// the model's generation_config.json, the tier's `sampling` over it, the request over both. The
// oracles are lib/engine generate() with explicit options and the tokenizer's decode.
import assert from "node:assert/strict";
import { generate } from "../../lib/engine/mod.ts";
import type { Runtime } from "../../lib/serve/mod.ts";
import { type Json, post, testRuntime } from "../shared/test_helpers.ts";
import { createGenerateApp } from "./app.ts";

const EOS = 4093;
const prompt = "The old lighthouse stood at the edge of the";

async function completion(rt: Runtime, body: Record<string, unknown>): Promise<Response> {
  const app = createGenerateApp(rt);
  return await app.request("/v1/completions", post({ model: "fast", prompt, ...body }));
}

async function ok(rt: Runtime, body: Record<string, unknown>): Promise<Json> {
  const res = await completion(rt, body);
  const json = await res.json();
  assert.equal(res.status, 200, JSON.stringify(json));
  return json;
}

Deno.test("repetition_penalty, top_k, min_p reach the sampler like generate() (completions, /v1/generate)", async () => {
  const rt = await testRuntime();
  try {
    const model = rt.tiers.get("fast")!.model;
    // A prompt whose own tokens the penalty must count: every one of them is seen.
    const repeats = "one two three, one two three, one two three, one two three";
    const opts = { maxTokens: 16, temperature: 0, repetitionPenalty: 1.4 };
    const want = await generate(model, repeats, opts);
    const plain = await generate(model, repeats, { maxTokens: 16, temperature: 0 });
    assert.notEqual(want.text, plain.text, "the penalty changes this greedy continuation");
    const body = { max_tokens: 16, temperature: 0, repetition_penalty: 1.4 };
    assert.equal((await ok(rt, { ...body, prompt: repeats })).choices[0].text, want.text);
    const app = createGenerateApp(rt);
    const gen = await app.request(
      "/v1/generate",
      post({ prompt: repeats, user_id: "u", tier: "fast", ...body }),
    );
    assert.equal((await gen.json()).response, want.text);
    const sampled = { maxTokens: 12, temperature: 0.9, topK: 20, minP: 0.05, seed: 3 };
    const ref = await generate(model, prompt, sampled);
    const got = await ok(rt, { max_tokens: 12, temperature: 0.9, top_k: 20, min_p: 0.05, seed: 3 });
    assert.equal(got.choices[0].text, ref.text);
    // top_k -1 and 0 mean off (vLLM), as no top_k at all.
    const off = await ok(rt, { max_tokens: 12, temperature: 0.9, seed: 3, top_k: -1 });
    const none = await generate(model, prompt, { maxTokens: 12, temperature: 0.9, seed: 3 });
    assert.equal(off.choices[0].text, none.text);
  } finally {
    await rt.close();
  }
});

Deno.test("min_tokens keeps EOS out, stop_token_ids stop without their text, ignore_eos runs past EOS", async () => {
  const rt = await testRuntime();
  try {
    const model = rt.tiers.get("fast")!.model;
    // logit_bias +100 on EOS forces it whenever it is allowed.
    const force = { temperature: 0, logit_bias: { [String(EOS)]: 100 } };
    const forced = await ok(rt, { ...force, max_tokens: 6 });
    assert.equal(forced.usage.completion_tokens, 1);
    assert.equal(forced.choices[0].finish_reason, "stop");
    const min = await ok(rt, { ...force, max_tokens: 6, min_tokens: 3 });
    assert.equal(min.usage.completion_tokens, 4); // 3 banned steps, then the forced EOS
    assert.equal(min.choices[0].finish_reason, "stop");
    const ignored = await ok(rt, { ...force, max_tokens: 5, ignore_eos: true });
    assert.equal(ignored.usage.completion_tokens, 5);
    assert.equal(ignored.choices[0].finish_reason, "length");
    // A stop id taken from the greedy continuation: the text ends before it, the token counts.
    const greedy = await generate(model, prompt, {
      maxTokens: 12,
      temperature: 0,
      stopTokenIds: [],
    });
    const at = greedy.tokenIds.findIndex((id, i) =>
      i >= 2 && !greedy.tokenIds.slice(0, i).includes(id)
    );
    const stopId = greedy.tokenIds[at];
    const stopped = await ok(rt, { temperature: 0, max_tokens: 12, stop_token_ids: [stopId] });
    assert.equal(stopped.choices[0].text, model.tokenizer.decode(greedy.tokenIds.slice(0, at)));
    assert.equal(stopped.choices[0].finish_reason, "stop");
    assert.equal(stopped.usage.completion_tokens, at + 1);
  } finally {
    await rt.close();
  }
});

Deno.test("the new fields' ranges: 400 naming the field (vLLM's bounds)", async () => {
  const rt = await testRuntime();
  try {
    const app = createGenerateApp(rt);
    const cases: [string, Record<string, unknown>, string][] = [
      ["repetition_penalty 0", { repetition_penalty: 0 }, "repetition_penalty"],
      ["repetition_penalty negative", { repetition_penalty: -1 }, "repetition_penalty"],
      ["repetition_penalty a string", { repetition_penalty: "1.1" }, "repetition_penalty"],
      ["min_tokens negative", { min_tokens: -1 }, "min_tokens"],
      ["min_tokens fractional", { min_tokens: 1.5 }, "min_tokens"],
      ["min_tokens over max_tokens", { min_tokens: 9, max_tokens: 8 }, "min_tokens"],
      ["stop_token_ids negative", { stop_token_ids: [5, -1] }, "stop_token_ids.1"],
      ["stop_token_ids outside the vocabulary", { stop_token_ids: [99999] }, "stop_token_ids.0"],
      ["stop_token_ids not an array", { stop_token_ids: 5 }, "stop_token_ids"],
      ["ignore_eos not a boolean", { ignore_eos: "yes" }, "ignore_eos"],
      ["top_k below -1", { top_k: -2 }, "top_k"],
      ["min_p over 1", { min_p: 1.5 }, "min_p"],
    ];
    for (const [what, extra, param] of cases) {
      for (
        const [path, body] of [
          ["/v1/completions", { model: "fast", prompt: "hi", max_tokens: 8, ...extra }],
          ["/v1/chat/completions", {
            model: "fast",
            messages: [{ role: "user", content: "hi" }],
            max_tokens: 8,
            ...extra,
          }],
          ["/v1/generate", { prompt: "hi", user_id: "u", max_tokens: 8, ...extra }],
        ] as const
      ) {
        const res = await app.request(path, post(body));
        const json = await res.json();
        assert.equal(res.status, 400, `${path} ${what}: ${JSON.stringify(json)}`);
        assert.equal(json.error.param, param, `${path} ${what}`);
      }
    }
  } finally {
    await rt.close();
  }
});

/** A copy of tiny-fast whose generation_config.json is `gen` (weights hard-linked or copied). */
async function modelWith(gen: Record<string, unknown>): Promise<string> {
  const src = new URL("../../models/tiny-fast/", import.meta.url).pathname;
  const dir = await Deno.makeTempDir({ prefix: "kvrelay-gencfg-" });
  for await (const e of Deno.readDir(src)) {
    if (e.name !== "generation_config.json") {
      await Deno.copyFile(`${src}${e.name}`, `${dir}/${e.name}`);
    }
  }
  await Deno.writeTextFile(
    `${dir}/generation_config.json`,
    JSON.stringify({ eos_token_id: EOS, ...gen }),
  );
  return dir;
}

Deno.test("sampling defaults: generation_config.json when tier and request are silent, the tier's sampling over it, the request over both", async () => {
  // A model that samples hot with top_k 5 by default: a silent request must draw exactly what
  // those values draw with the same seed, not what temperature 1 (no generation_config) draws.
  const dir = await modelWith({
    do_sample: true,
    temperature: 1.7,
    top_k: 5,
    repetition_penalty: 1.2,
  });
  const rt = await testRuntime({
    tiers: { fast: dir, tuned: dir },
    tier: { sampling: {} },
  });
  const tuned = await testRuntime({
    tiers: { fast: dir },
    tier: { sampling: { temperature: 0.5, repetition_penalty: 1 } },
  });
  try {
    const model = rt.tiers.get("fast")!.model;
    assert.deepEqual(model.samplingDefaults, {
      temperature: 1.7,
      top_k: 5,
      repetition_penalty: 1.2,
    });
    const text = async (r: Runtime, body: Record<string, unknown>) =>
      (await ok(r, { max_tokens: 16, seed: 11, ...body })).choices[0].text;
    const gen = (o: Record<string, number>) =>
      generate(model, prompt, { maxTokens: 16, seed: 11, ...o }).then((r) => r.text);
    const fromFile = await gen({ temperature: 1.7, topK: 5, repetitionPenalty: 1.2 });
    assert.equal(await text(rt, {}), fromFile);
    assert.notEqual(fromFile, await gen({ temperature: 1 }), "the defaults must change the draw");
    // The tier's sampling overrides field by field: top_k 5 still comes from the file.
    const tierWins = await gen({ temperature: 0.5, topK: 5 });
    assert.equal(await text(tuned, {}), tierWins);
    assert.notEqual(tierWins, fromFile);
    // The request overrides both, field by field.
    assert.equal(
      await text(tuned, { top_k: 0, temperature: 1.1 }),
      await gen({ temperature: 1.1 }),
    );
    assert.equal(
      await text(rt, { temperature: 0 }),
      await gen({ temperature: 0, repetitionPenalty: 1.2 }),
    );
  } finally {
    await rt.close();
    await tuned.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("generation_config.json do_sample: false means greedy by default; the request can still sample", async () => {
  const dir = await modelWith({ do_sample: false, temperature: 0.9 });
  const rt = await testRuntime({ tiers: { fast: dir }, tier: { sampling: {} } });
  try {
    const model = rt.tiers.get("fast")!.model;
    assert.equal(model.samplingDefaults.temperature, 0);
    const greedy = await generate(model, prompt, { maxTokens: 16, temperature: 0 });
    assert.equal((await ok(rt, { max_tokens: 16 })).choices[0].text, greedy.text);
    const hot = await generate(model, prompt, { maxTokens: 16, temperature: 1.5, seed: 2 });
    assert.equal(
      (await ok(rt, { max_tokens: 16, temperature: 1.5, seed: 2 })).choices[0].text,
      hot.text,
    );
  } finally {
    await rt.close();
    await Deno.remove(dir, { recursive: true });
  }
});
