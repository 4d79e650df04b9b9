// Tests of sampling on distributions built by hand (logits = ln p for chosen p): the kept support
// and renormalised probabilities are worked out in the test from the definitions, and seeded
// draws are compared with them by frequency.

import {
  assert,
  assertEquals,
  assertNotEquals,
  assertThrows,
} from "../../lib/tokenizer/_assert.ts";
import { argmax, Sampler, samplingDistribution } from "./sampler.ts";
import { mulberry32 } from "../../lib/util/mod.ts";

// p by token id: id 3 is the most likely, then 0, 4, 1, 2.
const P = [0.2, 0.1, 0.05, 0.5, 0.15];
const LOGITS = Float32Array.from(P, Math.log);

function close(actual: ArrayLike<number>, expected: number[], tol = 1e-6, what = "") {
  assertEquals(actual.length, expected.length, `${what} length`);
  for (let i = 0; i < expected.length; i++) {
    assert(
      Math.abs(actual[i] - expected[i]) < tol,
      `${what}[${i}] = ${actual[i]}, expected ${expected[i]}`,
    );
  }
}
const renorm = (ps: number[]) => ps.map((p) => p / ps.reduce((a, b) => a + b, 0));

Deno.test("`argmax()` picks the largest logit, the lowest id on ties, and skips NaN", () => {
  assertEquals(argmax(LOGITS), 3);
  assertEquals(argmax([1, 5, 5, 2]), 1);
  assertEquals(argmax([NaN, -1, NaN]), 1);
  assertThrows(() => argmax([-Infinity, NaN]), RangeError, "no finite");
});

Deno.test("`Sampler.sample()` is argmax when temperature is 0, whatever the seed", () => {
  for (let seed = 0; seed < 20; seed++) {
    assertEquals(new Sampler({ temperature: 0, seed }).sample(LOGITS), 3);
  }
});

Deno.test("`Sampler.sample()` tends to argmax when temperature goes to 0", () => {
  const s = new Sampler({ temperature: 1e-3, seed: 1 });
  for (let i = 0; i < 200; i++) assertEquals(s.sample(LOGITS), 3);
});

Deno.test("`samplingDistribution()` is softmax(logits / T) when no filter is set", () => {
  const d1 = samplingDistribution(LOGITS, { temperature: 1 });
  assertEquals(Array.from(d1.ids), [3, 0, 4, 1, 2]);
  close(d1.probs, [0.5, 0.2, 0.15, 0.1, 0.05], 1e-6, "T=1");
  // T = 2: p_i^(1/2), renormalised.
  const d2 = samplingDistribution(LOGITS, { temperature: 2 });
  close(d2.probs, renorm([0.5, 0.2, 0.15, 0.1, 0.05].map(Math.sqrt)), 1e-6, "T=2");
});

Deno.test("`samplingDistribution()` keeps exactly the k largest when topK is set", () => {
  for (let k = 1; k <= 5; k++) {
    const d = samplingDistribution(LOGITS, { topK: k });
    assertEquals(Array.from(d.ids), [3, 0, 4, 1, 2].slice(0, k), `k=${k}`);
    close(d.probs, renorm([0.5, 0.2, 0.15, 0.1, 0.05].slice(0, k)), 1e-6, `k=${k}`);
  }
  assertEquals(samplingDistribution(LOGITS, { topK: 99 }).ids.length, 5);
  // Ties at the boundary: exactly k survive, lower ids first.
  assertEquals(Array.from(samplingDistribution([1, 3, 3, 3, 2], { topK: 2 }).ids), [1, 2]);
});

Deno.test("`samplingDistribution()` keeps the smallest nucleus reaching topP", () => {
  const cases: [number, number[]][] = [
    [0.3, [3]], // 0.5 ≥ 0.3
    [0.5, [3]], // exactly reached by the first token
    [0.69, [3, 0]], // 0.7
    [0.71, [3, 0, 4]], // 0.85
    [0.9, [3, 0, 4, 1]], // 0.95
    [0.99, [3, 0, 4, 1, 2]],
    [1, [3, 0, 4, 1, 2]],
  ];
  for (const [p, ids] of cases) {
    const d = samplingDistribution(LOGITS, { topP: p });
    assertEquals(Array.from(d.ids), ids, `topP=${p}`);
    close(d.probs, renorm(ids.map((i) => P[i])), 1e-6, `topP=${p}`);
  }
  // A tiny topP still keeps one token.
  assertEquals(Array.from(samplingDistribution(LOGITS, { topP: 1e-9 }).ids), [3]);
});

Deno.test("`samplingDistribution()` applies topP to the top_k-renormalised distribution", () => {
  // top_k 3 → [0.5, 0.2, 0.15] / 0.85 = [0.588, 0.235, 0.176]; cumulative 0.588, 0.824 ≥ 0.8.
  assertEquals(Array.from(samplingDistribution(LOGITS, { topK: 3, topP: 0.8 }).ids), [3, 0]);
  // Without top_k the cumulative is 0.5, 0.7, 0.85: three tokens.
  assertEquals(Array.from(samplingDistribution(LOGITS, { topP: 0.8 }).ids), [3, 0, 4]);
});

Deno.test("`samplingDistribution()` drops tokens below minP × p_max", () => {
  const cases: [number, number[]][] = [
    [0.05, [3, 0, 4, 1, 2]], // threshold 0.025
    [0.15, [3, 0, 4, 1]], // 0.075
    [0.25, [3, 0, 4]], // 0.125
    [0.35, [3, 0]], // 0.175
    [0.9, [3]], // 0.45
    [1, [3]],
  ];
  for (const [m, ids] of cases) {
    const d = samplingDistribution(LOGITS, { minP: m });
    assertEquals(Array.from(d.ids), ids, `minP=${m}`);
    close(d.probs, renorm(ids.map((i) => P[i])), 1e-6, `minP=${m}`);
  }
  // With temperature 2 the ratios are sqrt: p_i/p_max = sqrt(p_i/0.5); 0.05 → 0.316 ≥ 0.3.
  assertEquals(samplingDistribution(LOGITS, { temperature: 2, minP: 0.3 }).ids.length, 5);
});

Deno.test("`samplingDistribution()` never keeps -Infinity or NaN logits", () => {
  const d = samplingDistribution([0, -Infinity, NaN, 0], { temperature: 1 });
  assertEquals(Array.from(d.ids), [0, 3]);
  close(d.probs, [0.5, 0.5]);
  assertThrows(
    () => samplingDistribution([-Infinity], { temperature: 1 }),
    RangeError,
    "no finite",
  );
});

Deno.test("`Sampler.sample()` draws with the filtered, renormalised frequencies over 40k seeded draws", () => {
  const configs = [
    { opts: { temperature: 1 }, expected: P },
    { opts: { temperature: 1, topK: 2 }, expected: [0.2 / 0.7, 0, 0, 0.5 / 0.7, 0] },
    { opts: { temperature: 1, topP: 0.71 }, expected: [0.2 / 0.85, 0, 0, 0.5 / 0.85, 0.15 / 0.85] },
    {
      opts: { temperature: 0.5, minP: 0.1 },
      expected: (() => {
        const q = P.map((p) => p * p); // T = 0.5 squares p; threshold 0.1·0.25 keeps p² ≥ 0.025
        const kept = q.map((x) => (x >= 0.025 ? x : 0));
        return renorm(kept);
      })(),
    },
  ];
  const n = 40_000;
  for (const { opts, expected } of configs) {
    const s = new Sampler({ ...opts, seed: 1234 });
    const counts = new Array(P.length).fill(0);
    for (let i = 0; i < n; i++) counts[s.sample(LOGITS)]++;
    for (let id = 0; id < P.length; id++) {
      const f = counts[id] / n;
      const sigma = Math.sqrt(Math.max(expected[id] * (1 - expected[id]), 1e-12) / n);
      assert(
        Math.abs(f - expected[id]) <= 5 * sigma + 1e-12,
        `${JSON.stringify(opts)} id ${id}: ${f} vs ${expected[id]}`,
      );
    }
  }
});

Deno.test("`Sampler.sample()` repeats a sequence for one seed and differs for another or no seed", () => {
  const logits = Float32Array.from({ length: 1000 }, (_, i) => Math.sin(i) * 2);
  const run = (seed?: number) => {
    const s = new Sampler({ temperature: 1, seed });
    return Array.from({ length: 50 }, () => s.sample(logits));
  };
  assertEquals(run(5), run(5));
  assertNotEquals(run(5), run(6));
  assertNotEquals(run(), run());
  assert(Number.isSafeInteger(new Sampler({}).options.seed));
});

Deno.test("`Sampler` throws RangeError quoting the value when an option is out of range", () => {
  assertThrows(() => new Sampler({ temperature: -1 }), RangeError, "-1");
  assertThrows(() => new Sampler({ temperature: NaN }), RangeError, "NaN");
  assertThrows(() => new Sampler({ topP: 0 }), RangeError, "topP");
  assertThrows(() => new Sampler({ topP: 1.5 }), RangeError, "1.5");
  assertThrows(() => new Sampler({ minP: 2 }), RangeError, "minP");
  assertThrows(() => new Sampler({ topK: 1.5 }), RangeError, "topK");
  assertThrows(() => new Sampler({ topK: -1 }), RangeError, "topK");
  assertThrows(() => new Sampler({ seed: 0.5 }), RangeError, "seed");
});

// Plain reference from the definitions: full sort, softmax, cut, cut, cut, renormalise.
function naiveDistribution(logits: number[], t: number, topK: number, topP: number, minP: number) {
  let ids = logits.map((_, i) => i).filter((i) => logits[i] > -Infinity);
  ids.sort((a, b) => logits[b] - logits[a] || a - b);
  if (topK > 0) ids = ids.slice(0, topK);
  const softmax = (xs: number[]) => {
    const m = Math.max(...xs.map((i) => logits[i] / t));
    const e = xs.map((i) => Math.exp(logits[i] / t - m));
    const z = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / z);
  };
  let p = softmax(ids);
  if (topP < 1) {
    let c = 0, keep = ids.length;
    for (let j = 0; j < ids.length; j++) {
      c += p[j];
      if (c >= topP) {
        keep = j + 1;
        break;
      }
    }
    ids = ids.slice(0, keep);
    p = p.slice(0, keep);
  }
  if (minP > 0) {
    const keep = ids.filter((_, j) => p[j] >= minP * p[0]).length;
    ids = ids.slice(0, keep);
  }
  return { ids, probs: softmax(ids) };
}

Deno.test("`samplingDistribution()` equals a full-sort reference on wide random logits", () => {
  const rand = mulberry32(12345);
  for (let trial = 0; trial < 60; trial++) {
    const vocab = 50 + Math.floor(rand() * 2000);
    const spread = [1, 10, 40][trial % 3];
    const logits = Array.from({ length: vocab }, () => Math.fround((rand() - 0.5) * spread * 2));
    const t = [0.3, 1, 2.5][Math.floor(rand() * 3)];
    const topK = [0, 0, 5, 200][Math.floor(rand() * 4)];
    const topP = [1, 0.5, 0.99, 0.999999][Math.floor(rand() * 4)];
    const minP = [0, 0, 0.05, 1e-12][Math.floor(rand() * 4)];
    const got = samplingDistribution(Float32Array.from(logits), {
      temperature: t,
      topK,
      topP,
      minP,
    });
    const want = naiveDistribution(logits, t, topK, topP, minP);
    const ctx = JSON.stringify({ trial, vocab, spread, t, topK, topP, minP });
    assertEquals(Array.from(got.ids), want.ids, ctx);
    close(got.probs, want.probs, 1e-9, ctx);
  }
});

Deno.test("`samplingDistribution()` gives +Infinity logits all the probability, shared equally, under every filter", () => {
  // ids 2, 5 and 9 are +Infinity; the finite rest (and NaN, -Infinity) must get nothing
  const l = Float32Array.from([3, NaN, Infinity, 1e30, -Infinity, Infinity, 0, -5, 2, Infinity]);
  const infs = [2, 5, 9];
  const configs = [
    { temperature: 1 },
    { temperature: 0.5, topK: 1 },
    { temperature: 1, topK: 2 },
    { temperature: 1.5, topK: 50 },
    { temperature: 1, topP: 0.5 },
    { temperature: 1, topP: 0.9 },
    { temperature: 1, minP: 0.1 },
    { temperature: 0.8, topK: 40, topP: 0.95, minP: 0.02 },
  ];
  for (const c of configs) {
    // top_k keeps the lowest-id k of the tied +Infinity tokens; top_p the shortest prefix of equal
    // shares reaching p; min_p keeps all (equal probabilities)
    let kept = infs.slice(0, c.topK ?? infs.length);
    if (c.topP !== undefined) kept = kept.slice(0, Math.ceil(c.topP * kept.length - 1e-12));
    const d = samplingDistribution(l, c);
    assertEquals(Array.from(d.ids), kept, JSON.stringify(c));
    close(d.probs, kept.map(() => 1 / kept.length), 1e-12, JSON.stringify(c));
  }
  // one +Infinity among finite logits: certain
  const one = Float32Array.from([5, Infinity, 7]);
  assertEquals(Array.from(samplingDistribution(one, { temperature: 1, topK: 3 }).ids), [1]);
});

Deno.test("`Sampler.sample()` draws only +Infinity tokens when a row has them, greedy or not", () => {
  const l = Float32Array.from([3, Infinity, 9, Infinity, 1]);
  for (
    const c of [
      { temperature: 0 },
      { temperature: 1 },
      { temperature: 1, topK: 2 },
      { temperature: 1, topP: 0.9 },
      { temperature: 1, minP: 0.5 },
    ]
  ) {
    const s = new Sampler({ ...c, seed: 3 });
    const seen = new Set<number>();
    for (let i = 0; i < 200; i++) seen.add(s.sample(l));
    // greedy: the lowest id of the tie; otherwise both +Infinity tokens, nothing else
    assertEquals([...seen].sort(), c.temperature === 0 ? [1] : [1, 3], JSON.stringify(c));
  }
});
