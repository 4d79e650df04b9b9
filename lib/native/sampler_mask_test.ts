// Tests of the allowed-token mask (kvr_sampler_set_mask, NativeSampler.setMask) against the
// TypeScript Sampler with the same mask, the oracle: the same tokens for the same logits, mask and
// seed (greedy and seeded settings), never a disallowed token, batched rows with and without masks
// drawing what their twins draw from the alone logits (the stage split and the in-group sampling
// of cpu/batch_forward.cpp), and malformed masks refused before any draw.

import assert from "node:assert/strict";
import { NativeSampler } from "./sampler.ts";
import { EngineError, NoAllowedTokenError, NoFiniteLogitError } from "./errors.ts";
import { type BatchItem, NativeModel, type NativeSamplingOptions } from "./mod.ts";
import { openNativeLibrary } from "./library.ts";
import { checkpoint, DEMO_DIRS, tokens } from "./test_helpers.ts";
import type { SamplingOptions, TokenMask } from "../engine/sampling.ts";
import { NoAllowedTokenRowError, Sampler } from "../../tests/reference/sampler.ts";
import { Xoshiro128 } from "../engine/prng.ts";

/** A mask over n tokens allowing each with probability `density` (at least one). */
function randomMask(n: number, rng: Xoshiro128, density: number): TokenMask {
  const words = new Uint32Array(Math.ceil(n / 32));
  for (let t = 0; t < n; t++) if (rng.nextFloat() < density) words[t >>> 5] |= 1 << (t & 31);
  if (!words.some((w) => w !== 0)) words[0] = 1;
  return { words, nTokens: n };
}

function allowed(mask: TokenMask, t: number): boolean {
  return t < mask.nTokens && ((mask.words[t >>> 5] >>> (t & 31)) & 1) === 1;
}

/** A logits row from a seeded stream: peaked, flat with ties, or with -inf and NaN. */
function row(n: number, rng: Xoshiro128, kind: number): Float32Array {
  const l = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const u = rng.nextFloat();
    l[i] = kind % 3 === 0
      ? (u - 0.5) * 6 + (i % 97 === 0 ? 8 * rng.nextFloat() : 0)
      : kind % 3 === 1
      ? Math.floor(u * 8) / 4
      : u < 0.05
      ? -Infinity
      : u < 0.07
      ? NaN
      : (u - 0.5) * 40;
  }
  return l;
}

const SETTINGS: SamplingOptions[] = [
  { temperature: 0 },
  { temperature: 1 },
  { temperature: 0.7 },
  { temperature: 0.8, topK: 1 },
  { temperature: 1.2, topK: 50 },
  { temperature: 1, topP: 0.9 },
  { temperature: 1, minP: 0.05 },
  { temperature: 0.9, topK: 40, topP: 0.95, minP: 0.02 },
];

Deno.test("a masked NativeSampler draws the masked TypeScript Sampler's tokens, greedy and seeded", () => {
  const data = new Xoshiro128(99);
  let draws = 0;
  for (const [si, s] of SETTINGS.entries()) {
    for (const seed of [0, 7, 2 ** 40 + 3]) {
      const ts = new Sampler({ ...s, seed });
      using nat = NativeSampler.create({ ...ts.options });
      for (let step = 0; step < 12; step++) {
        const n = step % 3 === 0 ? 4096 : step % 3 === 1 ? 1000 : 70;
        const l = row(n, data, step + si);
        // Mask shorter than the row, exactly the row, dense and sparse; every third step none.
        const nTokens = step % 4 === 1 ? n - 5 : n;
        const mask = step % 3 === 2 ? null : randomMask(nTokens, data, step % 2 ? 0.02 : 0.5);
        nat.setMask(mask);
        let want: number | Error;
        try {
          want = ts.sample(l, mask ?? undefined);
        } catch (e) {
          want = e as Error;
        }
        if (want instanceof Error) {
          assert.ok(want instanceof NoAllowedTokenRowError, String(want));
          assert.throws(() => nat.sample(l), NoAllowedTokenError);
          continue;
        }
        const got = nat.sample(l).token;
        assert.equal(got, want, `settings ${JSON.stringify(s)} seed ${seed} step ${step}`);
        if (mask) assert.ok(allowed(mask, got), `token ${got} is not allowed`);
        draws++;
      }
    }
  }
  assert.ok(draws > SETTINGS.length * 3 * 10, `only ${draws} draws compared`);
});

Deno.test("a masked token is never drawn even where it holds nearly all the probability", () => {
  const n = 4096;
  const data = new Xoshiro128(5);
  // The disallowed tokens carry the largest logits by far: any draw ignoring the mask picks one.
  const l = new Float32Array(n);
  for (let i = 0; i < n; i++) l[i] = i % 3 === 0 ? 1 + data.nextFloat() : 30 + data.nextFloat();
  const words = new Uint32Array(n / 32);
  for (let t = 0; t < n; t += 3) words[t >>> 5] |= 1 << (t & 31);
  const mask = { words, nTokens: n };
  for (const s of [{ temperature: 0 }, { temperature: 2 }, { temperature: 1.5, topP: 0.99 }]) {
    using nat = NativeSampler.create({ ...new Sampler({ ...s, seed: 1 }).options, seed: 1 });
    nat.setMask(mask);
    const seen = new Set<number>();
    for (let k = 0; k < 1500; k++) {
      const t = nat.sample(l).token;
      assert.equal(t % 3, 0, `disallowed token ${t} drawn with ${JSON.stringify(s)}`);
      seen.add(t);
    }
    if (s.temperature > 0) assert.ok(seen.size > 100, "the draws spread over the allowed tokens");
    // Cleared: the heavy disallowed tokens come back.
    nat.setMask(null);
    assert.notEqual(nat.sample(l).token % 3, 0);
  }
});

Deno.test("logprobs of a masked draw stay those of the raw row", () => {
  const data = new Xoshiro128(3);
  const l = row(512, data, 0);
  using plain = NativeSampler.create({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 });
  using masked = NativeSampler.create({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 });
  const mask = randomMask(512, data, 0.1);
  masked.setMask(mask);
  const m = masked.sample(l, 512, { logprob: true, topLogprobs: 5 });
  const p = plain.sample(l, 512, { topLogprobs: 5 });
  assert.ok(allowed(mask, m.token));
  assert.deepEqual(m.top, p.top);
  let lse = -Infinity;
  for (const v of l) if (v > -Infinity) lse = Math.max(lse, v);
  let sum = 0;
  for (const v of l) if (v > -Infinity) sum += Math.exp(v - lse);
  assert.ok(Math.abs(m.logprob! - (l[m.token] - lse - Math.log(sum))) < 1e-9);
});

Deno.test("malformed masks are refused, in TypeScript and by the library itself", () => {
  using nat = NativeSampler.create({ temperature: 1, topK: 0, topP: 1, minP: 0, seed: 1 });
  const l = new Float32Array(100).fill(0);
  assert.throws(() => nat.setMask({ words: new Uint32Array(3), nTokens: 100 }), /takes 4 words/);
  assert.throws(() => nat.setMask({ words: new Uint32Array(4), nTokens: 100 }), /allows no token/);
  assert.throws(
    () => nat.setMask({ words: Uint32Array.of(1, 0, 0, 1 << 4), nTokens: 100 }),
    /id >= nTokens/,
  );
  assert.throws(() => nat.setMask({ words: new Uint32Array(0), nTokens: 0 }), /nTokens/);
  assert.equal(nat.masked, false);
  // The library checks the same things when called directly (no TypeScript check in between).
  const lib = openNativeLibrary();
  const ptr = nat.pointer;
  assert.equal(lib.symbols.kvr_sampler_set_mask(ptr, new Uint32Array(3), 3n, 100), -1);
  assert.equal(lib.symbols.kvr_sampler_set_mask(ptr, new Uint32Array(4), 4n, 100), -1);
  assert.equal(lib.symbols.kvr_sampler_set_mask(ptr, Uint32Array.of(0, 0, 0, 16), 4n, 100), -2);
  assert.equal(lib.symbols.kvr_sampler_set_mask(ptr, null, 4n, 100), -1);
  assert.equal(lib.symbols.kvr_sampler_set_mask(ptr, new Uint32Array(1), 1n, 0), -1);
  // A mask covering more tokens than the row: refused at the draw, not read past the row.
  const wide = new Uint32Array(5).fill(0xffffffff);
  nat.setMask({ words: wide, nTokens: 160 });
  assert.throws(() => nat.sample(l), /covers 160 tokens, the row has 100/);
  const tok = new Int32Array(1);
  const st = lib.symbols.kvr_sampler_sample(ptr, l, 100n, 100, tok, null, null, null, 0, null);
  assert.equal(st, -2);
  // A mask whose allowed tokens lie past the width, or hold only -inf: a typed error.
  nat.setMask({ words: Uint32Array.of(0, 0, 0, 1 << 3), nTokens: 100 });
  assert.throws(() => nat.sample(l, 90), NoAllowedTokenError);
  const inf = new Float32Array(100).fill(1);
  inf[99] = -Infinity;
  assert.throws(() => nat.sample(inf), NoAllowedTokenError);
  // A row with no finite logit at all is the model's failure, not the mask's.
  assert.throws(() => nat.sample(new Float32Array(100).fill(-Infinity)), NoFiniteLogitError);
  assert.throws(
    () => nat.sample(new Float32Array(100).fill(-Infinity)),
    (e) => !(e instanceof NoAllowedTokenError),
  );
  nat.setMask(null);
  assert.equal(nat.sample(l).token >= 0, true);
});

// n = 6: the stage split; n = 36: sequences in groups, each thread sampling its own rows
// (cpu/batch_forward.cpp). Odd rows masked (a new random mask each step), even rows not.
for (const n of [6, 36]) {
  Deno.test(`batchStep() rows with masks draw what the masked TypeScript Sampler draws from the alone logits (${n} sequences)`, async () => {
    using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 2 });
    const vocab = model.config.vocabSize;
    const pool = model.createKvPool(512, 16);
    const seqs = Array.from({ length: n }, () => pool.createSequence(48));
    const alone = Array.from({ length: n }, () => model.createSequence(48));
    const opts = (i: number): NativeSamplingOptions => ({
      temperature: i % 4 === 1 ? 0 : 0.9,
      topK: i % 4 === 2 ? 40 : 0,
      topP: i % 4 === 3 ? 0.9 : 1,
      minP: 0,
      seed: 40 + i,
    });
    const samplers = seqs.map((_, i) => model.createSampler(opts(i)));
    const twins = seqs.map((_, i) => new Sampler(opts(i)));
    const data = new Xoshiro128(11);
    try {
      const next: number[] = [];
      for (let i = 0; i < n; i++) {
        const prompt = tokens(3 + (i % 5), vocab, 10 + i);
        await model.batchStep([{ seq: seqs[i], tokens: prompt, wantLogits: false }]);
        await alone[i].prefill(prompt);
        next.push(prompt[0]);
      }
      let masked = 0;
      for (let step = 0; step < 8; step++) {
        const masks = seqs.map((_, i) =>
          i % 2 === 1 ? randomMask(vocab, data, step % 2 ? 0.01 : 0.3) : null
        );
        masks.forEach((m, i) => samplers[i].setMask(m));
        const items: BatchItem[] = seqs.map((seq, i) => ({
          seq,
          tokens: [next[i]],
          wantLogits: false,
          sample: { sampler: samplers[i] },
        }));
        const out = await model.batchStep(items);
        for (let i = 0; i < n; i++) {
          const ref = await alone[i].decode(next[i]);
          const want = twins[i].sample(ref, masks[i] ?? undefined);
          assert.equal(out[i], want, `sequence ${i}, step ${step}`);
          if (masks[i]) {
            assert.ok(allowed(masks[i]!, out[i] as number));
            masked++;
          }
          next[i] = out[i] as number;
        }
      }
      assert.equal(masked, 8 * Math.floor(n / 2));
      // A burst with a masked row stops after one step (its next mask needs the grammar).
      const burst = await model.batchDecodeSteps(
        seqs.map((seq, i) => ({ seq, token: next[i], sample: { sampler: samplers[i] } })),
        4,
      );
      for (const b of burst) assert.equal((b as Int32Array).length, 1);
      samplers.forEach((s) => s.setMask(null));
      const free = await model.batchDecodeSteps(
        seqs.map((seq, i) => ({
          seq,
          token: (burst[i] as Int32Array)[0],
          sample: { sampler: samplers[i] },
        })),
        3,
      );
      for (const b of free) assert.equal((b as Int32Array).length, 3);
    } finally {
      for (const x of samplers) x.free();
      for (const x of [...seqs, ...alone]) x.free();
      pool.free();
    }
  });
}

Deno.test("batchStep() refuses a mask wider than the vocabulary and reports a row with no allowed token", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const vocab = model.config.vocabSize;
  using a = model.createSequence(8);
  using b = model.createSequence(8);
  await a.prefill([1, 2]);
  await b.prefill([3]);
  using sa = model.createSampler({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 });
  using sb = model.createSampler({ temperature: 0.8, topK: 0, topP: 1, minP: 0, seed: 2 });
  const words = new Uint32Array(Math.ceil((vocab + 1) / 32));
  words[0] = 1;
  sa.setMask({ words, nTokens: vocab + 1 });
  await assert.rejects(
    model.batchStep([{ seq: a, tokens: [1], wantLogits: false, sample: { sampler: sa } }]),
    (e) => e instanceof EngineError && /mask covers/.test(e.message),
  );
  assert.equal(a.length, 2);
  // Row a: its only allowed token lies past the width. Row b: unmasked, draws normally.
  const only = new Uint32Array(Math.ceil(vocab / 32));
  only[(vocab - 1) >>> 5] |= 1 << ((vocab - 1) & 31);
  sa.setMask({ words: only, nTokens: vocab });
  const out = await model.batchStep([
    { seq: a, tokens: [1], wantLogits: false, sample: { sampler: sa, width: vocab - 1 } },
    { seq: b, tokens: [1], wantLogits: false, sample: { sampler: sb } },
  ]);
  assert.ok(out[0] instanceof NoAllowedTokenError, String(out[0]));
  assert.equal(typeof out[1], "number");
  assert.equal(a.length, 3);
});
