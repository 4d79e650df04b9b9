// Tests of the reference logit processor and log-probabilities against plain formulas: bias and
// penalties computed by hand, log-softmax in float64 by a direct formula with a sort; and the
// native sampler's logprobs against the reference bit for bit.
import assert from "node:assert/strict";
import { LogitProcessor, stepLogprobs } from "./logits.ts";
import { NativeSampler } from "../../lib/native/mod.ts";
import { mulberry32 } from "../../lib/util/mulberry32.ts";

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
