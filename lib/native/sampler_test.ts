// Tests for NativeSampler (native/src/host/sampling.cpp) against the TypeScript Sampler of lib/engine,
// the oracle: the same tokens for the same logits and seed over many seeds, settings and rows
// (ties, -inf, NaN, flat and peaked rows), plus logprobs against a plain float64 log-softmax.

import assert from "node:assert/strict";
import { NativeSampler } from "./sampler.ts";
import { EngineError } from "./errors.ts";
import type { SamplingOptions } from "../engine/sampling.ts";
import { Sampler } from "../../tests/reference/sampler.ts";
import {
  applyRepetitionPenalty,
  LogitProcessor,
  stepLogprobs,
} from "../../tests/reference/logits.ts";
import { Xoshiro128 } from "../engine/prng.ts";

/** A logits row of `kind` from a seeded stream. */
function row(n: number, rng: Xoshiro128, kind: number): Float32Array {
  const l = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const u = rng.nextFloat();
    switch (kind % 4) {
      case 0: // peaked: a few large logits over a Gaussian-ish floor
        l[i] = (u - 0.5) * 6 + (i % 97 === 0 ? 8 * rng.nextFloat() : 0);
        break;
      case 1: // flat with many exact ties
        l[i] = Math.floor(u * 8) / 4;
        break;
      case 2: // wide range, some -inf and NaN
        l[i] = u < 0.05 ? -Infinity : u < 0.07 ? NaN : (u - 0.5) * 40;
        break;
      default: // near-uniform
        l[i] = u * 0.01;
    }
  }
  return l;
}

const SETTINGS: SamplingOptions[] = [
  { temperature: 0 },
  { temperature: 1 },
  { temperature: 0.7 },
  { temperature: 1.6 },
  { temperature: 0.8, topK: 1 },
  { temperature: 0.8, topK: 5 },
  { temperature: 1.2, topK: 50 },
  { temperature: 1, topP: 0.9 },
  { temperature: 0.6, topP: 0.5 },
  { temperature: 1, minP: 0.05 },
  { temperature: 1.3, minP: 0.3 },
  { temperature: 0.9, topK: 40, topP: 0.95, minP: 0.02 },
  { temperature: 1, topK: 100000 },
  { temperature: 0.5, topP: 0.999999 },
  { temperature: 0.7, topP: 0.95 }, // the demo models' generation_config
];

Deno.test("NativeSampler draws the TypeScript Sampler's tokens for identical logits, many seeds and settings", () => {
  const data = new Xoshiro128(2024);
  let draws = 0;
  for (const [si, s] of SETTINGS.entries()) {
    for (const seed of [0, 1, 42, -7, 2 ** 40 + 3, -(2 ** 52), 987654321]) {
      const opts = { ...s, seed };
      const ts = new Sampler(opts);
      using nat = NativeSampler.create({ ...ts.options });
      for (let step = 0; step < 12; step++) {
        const n = step % 3 === 0 ? 4096 : step % 3 === 1 ? 1000 : 37;
        const l = row(n, data, step + si);
        const width = step % 5 === 4 ? n - 3 : n;
        const want = ts.sample(l.subarray(0, width));
        const got = nat.sample(l, width).token;
        assert.equal(got, want, `settings ${JSON.stringify(opts)} step ${step} n ${n}`);
        draws++;
      }
    }
  }
  assert.equal(draws, SETTINGS.length * 7 * 12);
});

Deno.test("NativeSampler's top_p draw orders its candidates as the TypeScript Sampler: ties by id, -0 as +0, logits of every magnitude", () => {
  // top_p alone takes the candidates in order until their mass reaches top_p (sorted by a key of
  // the logit's bits): rows of few distinct values (long runs of ties), both zeros, and logits
  // from 1e-30 to 1e30 in magnitude, so the order's every byte and its tie rule decide draws.
  const data = new Xoshiro128(99);
  const values = [-0, 0, 0.25, -0.25, 1e-30, -1e-30, 3, -3, 1e4, -1e4, 1e30, -1e30, -Infinity];
  let draws = 0;
  for (const topP of [0.3, 0.9, 0.99]) {
    for (const seed of [0, 5, 77]) {
      const ts = new Sampler({ temperature: 1e30, topP, seed });
      using nat = NativeSampler.create({ ...ts.options });
      for (let step = 0; step < 40; step++) {
        const n = step % 2 ? 4096 : 300;
        const l = new Float32Array(n);
        // one step in two: the large values left out, so the draw spreads over the small ones
        const k = step % 2 ? values.length : 9;
        for (let i = 0; i < n; i++) l[i] = values[Math.floor(data.nextFloat() * k)];
        assert.equal(nat.sample(l).token, ts.sample(l), `top_p ${topP} seed ${seed} step ${step}`);
        draws++;
      }
    }
  }
  assert.equal(draws, 3 * 3 * 40);
});

Deno.test("NativeSampler keeps the stream in step with the TypeScript Sampler over a long generation", () => {
  const data = new Xoshiro128(7);
  const opts = { temperature: 0.9, topK: 20, topP: 0.9, seed: 31337 };
  const ts = new Sampler(opts);
  using nat = NativeSampler.create({ ...ts.options });
  for (let step = 0; step < 400; step++) {
    const l = row(512, data, 0);
    assert.equal(nat.sample(l).token, ts.sample(l), `step ${step}`);
  }
});

function logSoftmax(l: Float32Array, width: number): Float64Array {
  let max = -Infinity;
  for (let i = 0; i < width; i++) if (l[i] > max) max = l[i];
  let total = 0;
  for (let i = 0; i < width; i++) if (l[i] > -Infinity) total += Math.exp(l[i] - max);
  const out = new Float64Array(width);
  for (let i = 0; i < width; i++) {
    out[i] = l[i] > -Infinity ? l[i] - max - Math.log(total) : -Infinity;
  }
  return out;
}

Deno.test("NativeSampler returns the chosen and top-n logprobs of a plain float64 log-softmax", () => {
  const data = new Xoshiro128(99);
  using nat = NativeSampler.create({ temperature: 1, topK: 0, topP: 1, minP: 0, seed: 5 });
  for (let k = 0; k < 6; k++) {
    const l = row(3000, data, k);
    const width = 2990;
    const ref = logSoftmax(l, width);
    const r = nat.sample(l, width, { logprob: true, topLogprobs: 7 });
    assert.ok(Math.abs(r.logprob! - ref[r.token]) <= 1e-12 * Math.max(1, Math.abs(ref[r.token])));
    const order = [...Array(width).keys()].filter((i) => l[i] > -Infinity)
      .sort((a, b) => l[b] - l[a] || a - b).slice(0, 7);
    assert.deepEqual(Array.from(r.top!.ids), order);
    r.top!.logprobs.forEach((lp, j) =>
      assert.ok(Math.abs(lp - ref[order[j]]) <= 1e-12 * Math.max(1, -lp))
    );
  }
  // fewer finite logits than asked: only the finite ones come back
  const l = new Float32Array([-Infinity, 1, NaN, 2]);
  const r = nat.sample(l, 4, { topLogprobs: 4 });
  assert.deepEqual(Array.from(r.top!.ids), [3, 1]);
});

Deno.test("NativeSampler draws the TypeScript Sampler's tokens on rows holding +Infinity (their limit), every setting", () => {
  const data = new Xoshiro128(77);
  for (const [si, s] of SETTINGS.entries()) {
    const ts = new Sampler({ ...s, seed: 11 + si });
    using nat = NativeSampler.create({ ...ts.options });
    for (let step = 0; step < 8; step++) {
      const l = row(step % 2 ? 300 : 4096, data, step);
      const infs = 1 + (step % 3);
      for (let j = 0; j < infs; j++) l[(step * 977 + j * 131) % l.length] = Infinity;
      const want = ts.sample(l);
      assert.equal(l[want], Infinity, `TypeScript picks a +Infinity token (${JSON.stringify(s)})`);
      const r = nat.sample(l, l.length, { logprob: true, topLogprobs: 4 });
      assert.equal(r.token, want, `settings ${JSON.stringify(s)} step ${step}`);
      const count = l.filter((v) => v === Infinity).length;
      assert.equal(r.logprob, 0 - Math.log(count)); // the limit row: 0 − (0 + log(count))
      assert.deepEqual(
        Array.from(r.top!.ids),
        [...l.keys()].filter((i) => l[i] === Infinity).slice(0, 4),
      );
    }
  }
});

Deno.test("NativeSampler rejects bad options, widths and rows without a finite logit", () => {
  const base = { temperature: 1, topK: 0, topP: 1, minP: 0, seed: 1 };
  assert.throws(() => NativeSampler.create({ ...base, temperature: -1 }), /temperature/);
  assert.throws(() => NativeSampler.create({ ...base, topP: 0 }), /top_p/);
  assert.throws(() => NativeSampler.create({ ...base, minP: 1.5 }), /min_p/);
  using s = NativeSampler.create(base);
  assert.throws(() => s.sample(new Float32Array(4), 5), RangeError);
  assert.throws(() => s.sample(new Float32Array(4), 4, { topLogprobs: 65 }), RangeError);
  assert.throws(
    () => s.sample(new Float32Array([-Infinity, NaN]), 2),
    (e: unknown) => e instanceof EngineError && /no finite logit/.test(e.message),
  );
});

Deno.test("`decodeSample()` returns the token the sampler would draw from `decode()`'s logits, with logprobs", async () => {
  const { NativeModel } = await import("./model.ts");
  const { checkpoint, DEMO_DIRS, tokens } = await import("./test_helpers.ts");
  using m = await NativeModel.load(await checkpoint(DEMO_DIRS[1]), { threads: 2 });
  const V = m.config.vocabSize;
  const toks = tokens(20, V, 3);
  using a = m.createSequence(64);
  using b = m.createSequence(64);
  await a.prefill(toks);
  await b.prefill(toks);
  const opts = { temperature: 0.9, topK: 30, topP: 0.95, minP: 0, seed: 77 };
  using sa = a.createSampler(opts);
  using sb = NativeSampler.create(opts);
  let ta = toks[19], tb = toks[19];
  for (let i = 0; i < 10; i++) {
    const r = await a.decodeSample(ta, sa, V - 5, { logprob: true, topLogprobs: 3 });
    const logits = await b.decode(tb);
    const want = sb.sample(logits, V - 5, { logprob: true, topLogprobs: 3 });
    assert.deepEqual(r, want, `step ${i}`);
    ta = r.token;
    tb = want.token;
  }
  assert.equal(a.length, 30);
  // checked before FFI / before the decode: the sequence is unchanged
  await assert.rejects(() => a.decodeSample(V, sa), RangeError);
  await assert.rejects(() => a.decodeSample(1, sa, V + 1), RangeError);
  await assert.rejects(() => a.decodeSample(1, sa, V, { topLogprobs: 65 }), RangeError);
  assert.equal(a.length, 30);
  // the sampler is busy while a step runs
  const p = a.decodeSample(1, sa);
  assert.throws(() => sa.sample(new Float32Array(4)), /still running/);
  assert.throws(() => sa.free(), /still running/);
  await p;
  sa.sample(new Float32Array(4));
});

// The repetition penalty written out for one logit, as transformers documents it (float64, then
// float32 storage): an oracle independent of applyRepetitionPenalty and of the native code.
function penalised(l: number, p: number): number {
  return Math.fround(l > 0 ? l / p : l * p);
}

Deno.test("repetition penalty: native sampler = TypeScript twin = the plain rule on known logits (draws and logprobs)", () => {
  // Known row: token 3 leads, token 1 is second; 0 and 3 are seen in the prompt.
  const logits = new Float32Array([2.5, 2.0, -1.5, 3.0, 0.25, -0.5]);
  const seen = [3, 0, 2];
  const p = 1.6;
  const expected = Float32Array.from(logits, (l, i) => (seen.includes(i) ? penalised(l, p) : l));
  // By hand: 3.0/1.6 = 1.875 < 2.0, so greedy moves from token 3 to token 1; −1.5·1.6 = −2.4.
  assert.equal(expected[3], Math.fround(1.875));
  assert.equal(expected[2], Math.fround(-2.4));
  const twin = applyRepetitionPenalty(logits.slice(), new Set(seen), p);
  assert.deepEqual(twin, expected);
  // Greedy picks the penalised argmax; the logprobs are the log-softmax of the penalised row.
  const lse = Math.log(expected.reduce((s, v) => s + Math.exp(v - 2.0), 0)) + 2.0;
  using greedy = NativeSampler.create({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 });
  greedy.setRepetitionPenalty(p, seen);
  const g = greedy.sample(logits, logits.length, { logprob: true, topLogprobs: 3 });
  assert.equal(g.token, 1);
  assert.ok(Math.abs(g.logprob! - (expected[1] - lse)) < 1e-12);
  assert.deepEqual(Array.from(g.top!.ids), [1, 3, 0]); // 2.0, 1.875, 2.5/1.6 = 1.5625
  // The drawn token counts as seen for the next draw: token 1 is penalised next (2.0/1.6 = 1.25),
  // so the greedy pick is token 3 again (1.875).
  assert.equal(greedy.sample(logits).token, 3);
  // Off (1) and unseen ids change nothing.
  using off = NativeSampler.create({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 });
  off.setRepetitionPenalty(1, seen);
  assert.equal(off.sample(logits).token, 3);
  // Sampled draws: the native sampler on the raw row = the TypeScript Sampler on the twin's row,
  // seed for seed, across filters (the seen set grows with each draw on both sides).
  const rng = new Xoshiro128(77);
  for (
    const opts of [{ temperature: 1 }, { temperature: 0.7, topK: 3 }, {
      temperature: 1.3,
      topP: 0.8,
    }]
  ) {
    for (let seed = 0; seed < 20; seed++) {
      const big = row(500, rng, seed);
      const prompt = [7, 40, 41, 499, 250, 3];
      const full = { topK: 0, topP: 1, minP: 0, ...opts, seed };
      using native = NativeSampler.create(full);
      native.setRepetitionPenalty(1.3, prompt);
      const ts = new Sampler(full);
      const seenTs = new Set(prompt);
      for (let step = 0; step < 6; step++) {
        const want = ts.sample(applyRepetitionPenalty(big.slice(), seenTs, 1.3));
        seenTs.add(want);
        assert.equal(native.sample(big).token, want, `${JSON.stringify(full)} step ${step}`);
      }
    }
  }
});

Deno.test("repetition penalty: the native sampler refuses a penalty that is not > 0 or negative ids", () => {
  using s = NativeSampler.create({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 });
  for (const bad of [0, -1, NaN, Infinity]) {
    assert.throws(
      () => s.setRepetitionPenalty(bad),
      (e: unknown) => e instanceof EngineError && /repetition_penalty/.test(e.message),
    );
  }
  assert.throws(() => s.setRepetitionPenalty(1.2, [1, -3]), /seen_ids\[1\] = -3/);
});

Deno.test("logit_bias, presence/frequency and min_tokens: the native sampler = the plain rule on known logits", () => {
  const logits = new Float32Array([2.5, 2.0, -1.5, 3.0, 0.25, -0.5]);
  const greedy = () => NativeSampler.create({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 });
  // Bias, float64 then float32: token 4 gets 0.25 + 3.5 = 3.75 and leads; token 3 drops to 2.
  using biased = greedy();
  biased.setLogitBias(new Map([[4, 3.5], [3, -1], [99, 50]])); // id 99 is past the row: ignored
  const b = biased.sample(logits, logits.length, { logprob: true, topLogprobs: 2 });
  assert.equal(b.token, 4);
  assert.deepEqual(Array.from(b.top!.ids), [4, 0]);
  const rowB = [2.5, 2.0, -1.5, 2.0, 3.75, -0.5];
  const lse = Math.log(rowB.reduce((a, v) => a + Math.exp(v - 3.75), 0)) + 3.75;
  assert.ok(Math.abs(b.logprob! - (3.75 - lse)) < 1e-12, "logprobs are those of the biased row");
  // Presence 0.4, frequency 0.3 over the drawn tokens: token 3 first; drawn once it has
  // 3 − 0.7 = 2.3 < 2.5, so token 0; then token 0 has 2.5 − 0.7 = 1.8 and token 3 (2.3) leads.
  using pen = greedy();
  pen.setPresenceFrequency(0.4, 0.3);
  assert.deepEqual([0, 1, 2].map(() => pen.sample(logits).token), [3, 0, 3]);
  // min_tokens 2 with stop id 3: banned for the first two draws (token 0 leads then), then drawn.
  using minTok = greedy();
  minTok.setMinTokens(2, [3, 77]);
  assert.deepEqual([0, 1, 2, 3].map(() => minTok.sample(logits).token), [0, 0, 3, 3]);
  // Off settings change nothing.
  using off = greedy();
  off.setLogitBias(new Map());
  off.setPresenceFrequency(0, 0);
  off.setMinTokens(0, [3]);
  assert.equal(off.sample(logits).token, 3);
});

Deno.test("logit_bias, presence/frequency, repetition and min_tokens together: native draws = the reference processor and Sampler, seed for seed", () => {
  const rng = new Xoshiro128(2024);
  const bias = new Map([[0, 2.5], [13, -1.25], [97, 0.1], [194, 4], [499, -100], [600, 3]]);
  for (const opts of [{ temperature: 0 }, ...SETTINGS.slice(1, 12)]) {
    for (let seed = 0; seed < 8; seed++) {
      const big = row(500, rng, seed);
      const prompt = [7, 40, 41, 499, 250, 3];
      const full = { temperature: 1, topK: 0, topP: 1, minP: 0, ...opts, seed };
      const lo = { logitBias: bias, presencePenalty: 0.3, frequencyPenalty: 0.45 };
      const stops = [194, 0];
      using native = NativeSampler.create(full);
      native.setRepetitionPenalty(1.2, prompt);
      native.setLogitBias(bias);
      native.setPresenceFrequency(lo.presencePenalty, lo.frequencyPenalty);
      native.setMinTokens(4, stops);
      const ref = new Sampler(full);
      const proc = new LogitProcessor({ ...lo, repetitionPenalty: 1.2 }, prompt, {
        minTokens: 4,
        ids: stops,
      });
      for (let step = 0; step < 10; step++) {
        const r = proc.process(big);
        const want = ref.sample(r);
        proc.push(want);
        const got = native.sample(big, big.length, { logprob: true, topLogprobs: 4 });
        assert.equal(got.token, want, `${JSON.stringify(full)} step ${step}`);
        const lp = stepLogprobs(r, want, 4);
        assert.equal(got.logprob, lp.logprob);
        assert.deepEqual(Array.from(got.top!.ids), lp.top.map((t) => t.id));
        assert.deepEqual(Array.from(got.top!.logprobs), lp.top.map((t) => t.logprob));
        if (step < 4) assert.ok(!stops.includes(got.token), "a stop id before min_tokens");
      }
    }
  }
});

Deno.test("logit_bias, presence/frequency and min_tokens: the native sampler refuses non-finite values and negative ids", () => {
  using s = NativeSampler.create({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 });
  assert.throws(() => s.setLogitBias(new Map([[-2, 1]])), /ids\[0\] = -2 is negative/);
  assert.throws(() => s.setLogitBias(new Map([[5, NaN]])), /logit_bias\[5\] must be a finite/);
  assert.throws(() => s.setPresenceFrequency(Infinity, 0), /presence_penalty must be a finite/);
  assert.throws(() => s.setPresenceFrequency(0, NaN), /frequency_penalty must be a finite/);
  assert.throws(() => s.setMinTokens(3, [1, -1]), /stop_ids\[1\] = -1 is negative/);
  assert.throws(() => s.setMinTokens(-1, [1]), RangeError);
});
