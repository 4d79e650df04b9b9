// Tests of perplexity scoring. Oracle: per-window fresh-sequence prefills with all positions and
// a log-softmax written here (float64), and window counts worked out by hand.

import { assert, assertEquals, assertRejects } from "../tokenizer/_assert.ts";
import { loadModel } from "./load.ts";
import { negLogLikelihood, scoreTokens } from "./score.ts";

const root = new URL("../../", import.meta.url).pathname;
const m = await loadModel(`${root}models/tiny-fast`, { threads: 2 });

// Plain reference: for each window, prefill all of it and average −log p(next token).
async function reference(ids: number[], context: number) {
  let total = 0, count = 0;
  const vocab = m.native.config.vocabSize;
  for (let start = 0; start < ids.length; start += context) {
    const w = ids.slice(start, start + context);
    if (w.length < 2) continue;
    const seq = m.native.createSequence(w.length);
    const logits = await seq.prefill(w, { allPositions: true });
    seq.free();
    for (let i = 0; i + 1 < w.length; i++) {
      const row = Array.from(logits.subarray(i * vocab, (i + 1) * vocab), Number);
      const lse = Math.log(row.reduce((s, x) => s + Math.exp(x), 0));
      total += lse - row[w[i + 1]];
      count++;
    }
  }
  return { count, mean: total / count };
}

Deno.test("`negLogLikelihood()` is −ln p for a hand-made two-token distribution", () => {
  const logits = Float32Array.from([0, Math.log(3), 5, 5]); // rows: [1/4, 3/4], [1/2, 1/2]
  assert(Math.abs(negLogLikelihood(logits, 0, 2, 0) - Math.log(4)) < 1e-6);
  assert(Math.abs(negLogLikelihood(logits, 0, 2, 1) - Math.log(4 / 3)) < 1e-6);
  assert(Math.abs(negLogLikelihood(logits, 1, 2, 1) - Math.log(2)) < 1e-9);
});

Deno.test("`scoreTokens()` counts n−1 per window and drops a final 1-token window", async () => {
  const ids = Array.from({ length: 37 }, (_, i) => (i * 131 + 7) % 4000);
  assertEquals((await scoreTokens(m, ids, { context: 8 })).tokens, 7 * 4 + 4); // 8,8,8,8,5
  assertEquals((await scoreTokens(m, ids.slice(0, 17), { context: 8 })).tokens, 7 + 7); // 8,8,1
  assertEquals((await scoreTokens(m, ids.slice(0, 5), { context: 512 })).tokens, 4);
});

Deno.test("`scoreTokens()` mean NLL equals per-window prefill + float64 log-softmax", async () => {
  const text =
    "It has been heretofore known to Congress that frequent incursions have been made on our " +
    "frontier settlements by certain banditti of Indians from the northwest side of the Ohio.";
  const ids = m.tokenizer.encode(text);
  for (const context of [7, 16, 512]) {
    const r = await scoreTokens(m, ids, { context });
    const ref = await reference(ids, context);
    assertEquals(r.tokens, ref.count);
    // The reference feeds whole windows, scoreTokens all but the last token: the native kernels
    // then batch differently, so float32 logits agree to rounding (~1e-7), not bit for bit.
    assert(
      Math.abs(r.meanNll - ref.mean) < 1e-6,
      `context ${context}: ${r.meanNll} vs ${ref.mean}`,
    );
    assert(Math.abs(r.ppl - Math.exp(r.meanNll)) < 1e-12 * r.ppl);
  }
});

Deno.test("`scoreTokens()` throws RangeError for context < 2 or nothing to predict", async () => {
  await assertRejects(() => scoreTokens(m, [1, 2, 3], { context: 1 }), RangeError, "context");
  await assertRejects(() => scoreTokens(m, [1], {}), RangeError, "nothing to score");
});
