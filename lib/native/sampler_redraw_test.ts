// Tests of draw-then-redraw (kvr_sampler_keep_row / kvr_sampler_redraw, NativeSampler.keepRow /
// redraw) against twin samplers as the oracle: a redraw is the masked draw a twin makes from the
// same row at the same point of its PRNG stream, the replaced token stops counting for the
// penalties and min_tokens (the next draws equal those of a twin that never drew it), a batched
// step's kept row is its logits row, and the misuses are refused. The claim that drawing first is
// exact (redrawIsExact) is checked as a distribution: drawn first and redrawn on rejection, the
// tokens follow the masked softmax.

import assert from "node:assert/strict";
import { NativeSampler } from "./sampler.ts";
import { EngineError, NoAllowedTokenError } from "./errors.ts";
import { NativeModel } from "./mod.ts";
import { checkpoint, DEMO_DIRS, tokens } from "./test_helpers.ts";
import { redrawIsExact, type TokenMask } from "../engine/sampling.ts";
import { Xoshiro128 } from "../engine/prng.ts";

function maskOf(n: number, ids: readonly number[]): TokenMask {
  const words = new Uint32Array(Math.ceil(n / 32));
  for (const t of ids) words[t >>> 5] |= 1 << (t & 31);
  return { words, nTokens: n };
}

function randomRow(n: number, rng: Xoshiro128): Float32Array {
  return Float32Array.from({ length: n }, () => (rng.nextFloat() - 0.5) * 6);
}

Deno.test("a redraw is the masked draw a twin sampler makes from the same row, greedy and seeded", () => {
  const rng = new Xoshiro128(5);
  for (const temperature of [0, 0.7, 1.3]) {
    for (const seed of [1, 99]) {
      using first = NativeSampler.create({ temperature, topK: 0, topP: 1, minP: 0, seed });
      using twin = NativeSampler.create({ temperature, topK: 0, topP: 1, minP: 0, seed });
      first.keepRow(true);
      for (let step = 0; step < 40; step++) {
        const l = randomRow(300, rng);
        const mask = maskOf(
          300,
          Array.from({ length: 1 + (step % 7) * 20 }, (_, i) => (i * 13 + step) % 300),
        );
        const drawn = first.sample(l).token;
        assert.equal(twin.sample(l).token, drawn, "unmasked draws of twins");
        first.setMask(mask);
        twin.setMask(mask);
        const redrawn = first.redraw({ logprob: true, topLogprobs: 3 });
        const want = twin.sample(l, l.length, { logprob: true, topLogprobs: 3 });
        assert.deepEqual(redrawn, want, `T ${temperature} seed ${seed} step ${step}`);
        first.setMask(null);
        twin.setMask(null);
      }
    }
  }
});

Deno.test("a redraw's replaced token stops counting for the penalties and min_tokens", () => {
  // Greedy, so every draw is a pure function of the row and the sampler's counts: after the
  // redraw, `first` must draw as `twin`, which drew the redrawn token directly under the mask.
  const n = 64;
  const configure = (s: NativeSampler) => {
    s.setRepetitionPenalty(3, [2]);
    s.setPresenceFrequency(1.5, 0.5);
    s.setMinTokens(2, [9]);
  };
  using first = NativeSampler.create({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 });
  using twin = NativeSampler.create({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 });
  configure(first);
  configure(twin);
  first.keepRow(true);
  const l1 = new Float32Array(n).fill(0);
  l1[5] = 4; // drawn first, then refused by the mask
  l1[6] = 3;
  assert.equal(first.sample(l1).token, 5);
  const mask = maskOf(n, [6, 7, 9]);
  first.setMask(mask);
  twin.setMask(mask);
  assert.equal(first.redraw().token, 6);
  assert.equal(twin.sample(l1).token, 6);
  first.setMask(null);
  twin.setMask(null);
  // Token 5 leads by a margin the penalties would take away had it been counted (repetition ÷3,
  // presence and frequency −2), and the stop id 9 is still banned (one draw counted, not two).
  const l2 = new Float32Array(n).fill(0);
  l2[5] = 2;
  l2[7] = 1.5;
  l2[9] = 10;
  const next = first.sample(l2).token;
  assert.equal(next, twin.sample(l2).token);
  assert.equal(next, 5);
  // And both now count two draws: the stop id is allowed.
  assert.equal(first.sample(l2).token, 9);
  assert.equal(twin.sample(l2).token, 9);
});

Deno.test("a redraw needs a kept row, once per draw; a mask without a finite allowed logit is refused", () => {
  const l = Float32Array.from([1, 2, -Infinity, 0.5]);
  using s = NativeSampler.create({ temperature: 1, topK: 0, topP: 1, minP: 0, seed: 3 });
  s.sample(l);
  assert.throws(
    () => s.redraw(),
    (e) => e instanceof EngineError && /no draw to redraw/.test(e.message),
  );
  s.keepRow(true);
  assert.equal(s.keepsRows, true);
  s.sample(l);
  s.setMask(maskOf(4, [2]));
  assert.throws(() => s.redraw(), NoAllowedTokenError);
  assert.throws(() => s.redraw(), /no draw to redraw/, "a failed redraw used the kept row");
  s.setMask(maskOf(4, [0]));
  s.sample(l);
  assert.equal(s.redraw().token, 0);
  assert.throws(() => s.redraw(), /no draw to redraw/, "twice for one draw");
  s.setMask(null);
  s.sample(l);
  s.keepRow(false);
  assert.throws(() => s.redraw(), /no draw to redraw/, "keepRow(false) drops the kept row");
});

Deno.test("drawn first and redrawn under the mask on rejection, tokens follow the masked softmax", () => {
  // The exactness claim of redrawIsExact, as a distribution: 8 tokens, 3 allowed, T = 0.8.
  const l = Float32Array.from([2, 1.5, 1, 0.5, 0, -0.5, 1.2, 0.3]);
  const allowedIds = [1, 3, 6];
  const mask = maskOf(8, allowedIds);
  const opts = { temperature: 0.8, topK: 0, topP: 1, minP: 0, seed: 11 };
  assert.ok(redrawIsExact(opts));
  using s = NativeSampler.create(opts);
  s.keepRow(true);
  const draws = 40_000;
  const counts = new Map<number, number>();
  let redrawn = 0;
  for (let i = 0; i < draws; i++) {
    let t = s.sample(l).token;
    if (!allowedIds.includes(t)) {
      s.setMask(mask);
      t = s.redraw().token;
      s.setMask(null);
      redrawn++;
    }
    counts.set(t, (counts.get(t) ?? 0) + 1);
  }
  const w = allowedIds.map((t) => Math.exp(l[t] / 0.8));
  const z = w.reduce((a, b) => a + b);
  // Chi-square with 2 degrees of freedom: 27.6 is its 1e-6 tail (a fixed seed: deterministic).
  let chi2 = 0;
  for (const [j, t] of allowedIds.entries()) {
    const expected = draws * w[j] / z;
    chi2 += (counts.get(t)! - expected) ** 2 / expected;
  }
  assert.ok(chi2 < 27.6, `chi-square ${chi2.toFixed(2)} (counts ${[...counts]})`);
  assert.equal([...counts.keys()].every((t) => allowedIds.includes(t)), true);
  assert.ok(redrawn > draws / 4, `the test exercises redraws (${redrawn})`);
  // Filters are not exact that way.
  assert.equal(redrawIsExact({ ...opts, topP: 0.9 }), false);
  assert.equal(redrawIsExact({ ...opts, temperature: 0, topK: 5 }), true);
});

Deno.test("batchStep() rows keep their logits row for a redraw", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 2 });
  const vocab = model.config.vocabSize;
  const pool = model.createKvPool(16, 16);
  const prompt = tokens(6, vocab, 3);
  const seqA = pool.createSequence(32), seqB = pool.createSequence(32);
  const opts = { temperature: 0.9, topK: 0, topP: 1, minP: 0, seed: 17 };
  using kept = model.createSampler(opts);
  using twin = model.createSampler(opts);
  try {
    kept.keepRow(true);
    const [, logits] = await model.batchStep([
      { seq: seqA, tokens: prompt, wantLogits: false, sample: { sampler: kept } },
      { seq: seqB, tokens: prompt, wantLogits: true },
    ]);
    const row = logits as Float32Array;
    twin.sample(row); // the same stream position as `kept` after its in-step draw
    const mask = maskOf(vocab, [11, 400, 2049]);
    kept.setMask(mask);
    twin.setMask(mask);
    assert.deepEqual(kept.redraw({ logprob: true }), twin.sample(row, vocab, { logprob: true }));
  } finally {
    seqA.free();
    seqB.free();
    pool.free();
  }
});
