// Tests of the logit processor and log-probabilities against plain references: bias and
// penalties computed by hand, log-softmax in float64 by a direct formula with a sort, and a
// generation whose first token's logprob is the prefill logits' log-softmax.
import assert from "node:assert/strict";
import { generate } from "./generate.ts";
import { loadModel } from "./load.ts";
import { LogitProcessor, needsLogits, stepLogprobs } from "./logits.ts";
import { NativeSampler } from "../native/mod.ts";
import { mulberry32 } from "../util/mulberry32.ts";

Deno.test("LogitProcessor.process() adds logit_bias and subtracts count·frequency + presence", () => {
  const p = new LogitProcessor({
    logitBias: new Map([[1, 5], [3, -100]]),
    presencePenalty: 0.5,
    frequencyPenalty: 0.25,
  });
  const row = new Float32Array([1, 2, 3, 4]);
  assert.deepEqual([...p.process(row)], [1, 7, 3, -96]);
  p.push(2);
  p.push(2);
  p.push(0);
  // token 2: 3 − (2·0.25 + 0.5) = 2; token 0: 1 − (0.25 + 0.5) = 0.25
  assert.deepEqual([...p.process(row)], [0.25, 7, 2, -96]);
  assert.deepEqual([...row], [1, 2, 3, 4], "the input row is not changed");
  assert.equal(needsLogits({}), false);
  assert.equal(needsLogits({ logprobs: 0 }), true);
  assert.equal(needsLogits({ presencePenalty: 0, frequencyPenalty: 0 }), false);
});

Deno.test("stepLogprobs() equals a float64 log-softmax and lists the top ids, ties by lower id", () => {
  const row = new Float32Array([0.5, 2, -1, 2, 7, -Infinity, 3]);
  const max = Math.max(...[...row].filter((x) => x > -Infinity));
  const lse = max +
    Math.log([...row].reduce((s, x) => s + (x > -Infinity ? Math.exp(x - max) : 0), 0));
  const want = [...row].map((x, i) => ({ id: i, logprob: x - lse }))
    .sort((a, b) => b.logprob - a.logprob || a.id - b.id);
  const got = stepLogprobs(row, 3, 4);
  assert.equal(got.id, 3);
  assert.ok(Math.abs(got.logprob - (2 - lse)) < 1e-12);
  assert.deepEqual(got.top.map((t) => t.id), want.slice(0, 4).map((t) => t.id));
  for (const [i, t] of got.top.entries()) assert.ok(Math.abs(t.logprob - want[i].logprob) < 1e-12);
  assert.equal(stepLogprobs(row, 5, 0).logprob, -Infinity);
  assert.deepEqual(stepLogprobs(row, 0, 0).top, []);
});

Deno.test("generate() with logprobs reports the prefill logits' log-softmax for the first token; logit_bias forces a token", async () => {
  const model = await loadModel(new URL("../../models/tiny-fast", import.meta.url).pathname, {
    threads: 1,
  });
  try {
    const prompt = "The harbour was quiet that morning";
    const ids = model.tokenizer.encode(prompt);
    const seq = model.native.createSequence(ids.length + 1);
    const logits = await seq.prefill(ids);
    seq.free();
    const width = Math.min(logits.length, model.tokenizer.vocabSize);
    let max = -Infinity;
    for (let i = 0; i < width; i++) max = Math.max(max, logits[i]);
    let sum = 0;
    for (let i = 0; i < width; i++) sum += Math.exp(logits[i] - max);
    const chunks = [];
    const { generateStream } = await import("./generate.ts");
    const it = generateStream(model, prompt, { maxTokens: 3, temperature: 0, logprobs: 5 });
    for (let s = await it.next(); !s.done; s = await it.next()) chunks.push(s.value);
    const first = chunks[0].logprobs!;
    assert.equal(first.id, chunks[0].tokenId);
    assert.ok(Math.abs(first.logprob - (logits[first.id] - max - Math.log(sum))) < 1e-5);
    assert.equal(first.top.length, 5);
    assert.equal(first.top[0].id, first.id, "greedy picks the most likely token");
    // Same greedy text as without logprobs (TypeScript sampling path vs native sampling).
    const plain = await generate(model, prompt, { maxTokens: 3, temperature: 0 });
    assert.deepEqual(chunks.map((c) => c.tokenId), plain.tokenIds);
    const forced = plain.tokenIds[0] === 7 ? 8 : 7;
    const biased = await generate(model, prompt, {
      maxTokens: 4,
      temperature: 0,
      logitBias: new Map([[forced, 100]]),
      stopTokenIds: [],
    });
    assert.deepEqual(biased.tokenIds, [forced, forced, forced, forced]);
  } finally {
    model.native.free();
  }
});

Deno.test("generate() with a frequency penalty matches a step-by-step reference of the OpenAI formula", async () => {
  const model = await loadModel(new URL("../../models/tiny-fast", import.meta.url).pathname, {
    threads: 1,
  });
  try {
    const prompt = "one two one two one two one two";
    const ids = model.tokenizer.encode(prompt);
    const n = 6, fp = 1.5, pp = 0.5;
    const got = await generate(model, prompt, {
      maxTokens: n,
      temperature: 0,
      frequencyPenalty: fp,
      presencePenalty: pp,
      stopTokenIds: [],
    });
    // Reference: argmax of (logits − count·fp − [count>0]·pp), decoding each pick.
    const seq = model.native.createSequence(ids.length + n);
    try {
      let logits = await seq.prefill(ids);
      const counts = new Map<number, number>();
      const want: number[] = [];
      const width = model.tokenizer.vocabSize;
      for (let step = 0; step < n; step++) {
        let best = -1, bestV = -Infinity;
        for (let i = 0; i < width; i++) {
          const c = counts.get(i) ?? 0;
          const v = Math.fround(logits[i] - (c * fp + (c > 0 ? pp : 0)));
          if (v > bestV) {
            bestV = v;
            best = i;
          }
        }
        want.push(best);
        counts.set(best, (counts.get(best) ?? 0) + 1);
        if (step < n - 1) logits = await seq.decode(best);
      }
      assert.deepEqual(got.tokenIds, want);
    } finally {
      seq.free();
    }
  } finally {
    model.native.free();
  }
});

Deno.test("stepLogprobs() leaves impossible tokens out of the top list and equals the native sampler's logprobs bit for bit", () => {
  const few = new Float32Array([-Infinity, 1, NaN, 2, -Infinity]);
  assert.deepEqual(stepLogprobs(few, 1, 4).top.map((t) => t.id), [3, 1]);
  using native = NativeSampler.create({ temperature: 1, topK: 0, topP: 1, minP: 0, seed: 3 });
  const rand = mulberry32(7);
  for (let k = 0; k < 40; k++) {
    const width = 50 + Math.floor(rand() * 5000);
    const row = new Float32Array(width + 3);
    for (let i = 0; i < row.length; i++) {
      // coarse values (many ties), a few impossible tokens, one NaN now and then
      row[i] = k % 2 ? Math.round(rand() * 8) / 4 : (rand() - 0.5) * 30;
      if (rand() < 0.01) row[i] = -Infinity;
    }
    if (k % 5 === 0) row[3] = NaN;
    const top = k % 21;
    const r = native.sample(row, width, { logprob: true, topLogprobs: top });
    const want = stepLogprobs(row.subarray(0, width), r.token, top);
    assert.equal(r.logprob, want.logprob);
    assert.deepEqual(Array.from(r.top?.ids ?? []), want.top.map((t) => t.id));
    assert.deepEqual(Array.from(r.top?.logprobs ?? []), want.top.map((t) => t.logprob));
  }
});

Deno.test("`stepLogprobs()` splits the probability among +Infinity logits: -log(count) each, the rest -Infinity", () => {
  const l = Float32Array.from([1, Infinity, 50, NaN, Infinity, -Infinity]);
  const r = stepLogprobs(l, 4, 5);
  assert.equal(r.logprob, 0 - Math.log(2));
  assert.deepEqual(r.top, [{ id: 1, logprob: 0 - Math.log(2) }, {
    id: 4,
    logprob: 0 - Math.log(2),
  }]);
  assert.equal(stepLogprobs(l, 2, 0).logprob, -Infinity);
});
