// generate() with logit processing options against references written in the test: the first
// token's logprob is the prefill logits' log-softmax, logit_bias forces a token, and a frequency
// plus presence penalty follows the OpenAI formula step by step.
import assert from "node:assert/strict";
import { generate } from "./generate.ts";
import { loadModel } from "./load.ts";

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
    // Same greedy text as without logprobs (the top-n outputs do not change the draw).
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
