// Tests of the native projection kernels against independent float64 references: ridge
// accumulation + Cholesky solve vs a plain two-pass centred normal-equation solve (Gaussian
// elimination), a planted linear map, ill-conditioned input, and RoPE strip/re-apply vs
// tests/reference/forward.ts applyRope.

import assert from "node:assert/strict";
import type { ModelConfig } from "../model/mod.ts";
import { applyRope, ropeInvFreq } from "../../tests/reference/forward.ts";
import { mulberry32 } from "../../tests/fixtures/random_checkpoint.ts";
import { EngineError } from "../native/mod.ts";
import {
  type CacheBlock,
  kvFromFeatures,
  kvToFeatures,
  LinearKernel,
  RidgeAccumulator,
} from "./native.ts";

function randn(rand: () => number): number {
  const u = Math.max(rand(), 1e-12), v = rand();
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
}

/** Plain float64 ridge: centred two-pass covariance, Gaussian elimination with pivoting. */
function referenceRidge(
  x: Float32Array,
  y: Float32Array,
  rows: number,
  nIn: number,
  nOut: number,
  sel: number[],
  o0: number,
  oc: number,
  lambda: number,
): { w: Float64Array; bias: Float64Array } {
  const n = sel.length;
  const mx = new Float64Array(n), my = new Float64Array(oc);
  for (let r = 0; r < rows; r++) {
    for (let a = 0; a < n; a++) mx[a] += x[r * nIn + sel[a]] / rows;
    for (let o = 0; o < oc; o++) my[o] += y[r * nOut + o0 + o] / rows;
  }
  const s = Array.from({ length: n }, () => new Float64Array(n + oc));
  for (let r = 0; r < rows; r++) {
    const xc = sel.map((f, a) => x[r * nIn + f] - mx[a]);
    for (let a = 0; a < n; a++) {
      for (let b = 0; b < n; b++) s[a][b] += (xc[a] * xc[b]) / rows;
      for (let o = 0; o < oc; o++) s[a][n + o] += (xc[a] * (y[r * nOut + o0 + o] - my[o])) / rows;
    }
  }
  let tr = 0;
  for (let a = 0; a < n; a++) tr += s[a][a];
  for (let a = 0; a < n; a++) s[a][a] += (lambda * tr) / n;
  // Gauss-Jordan with partial pivoting on [S | B]
  for (let c = 0; c < n; c++) {
    let p = c;
    for (let r = c + 1; r < n; r++) if (Math.abs(s[r][c]) > Math.abs(s[p][c])) p = r;
    [s[c], s[p]] = [s[p], s[c]];
    for (let r = 0; r < n; r++) {
      if (r === c) continue;
      const f = s[r][c] / s[c][c];
      for (let j = c; j < n + oc; j++) s[r][j] -= f * s[c][j];
    }
  }
  const w = new Float64Array(oc * n), bias = new Float64Array(oc);
  for (let o = 0; o < oc; o++) {
    let b = my[o];
    for (let a = 0; a < n; a++) {
      w[o * n + a] = s[a][n + o] / s[a][a];
      b -= w[o * n + a] * mx[a];
    }
    bias[o] = b;
  }
  return { w, bias };
}

function maxRel(a: Float64Array, b: Float64Array): number {
  let scale = 0, diff = 0;
  for (let i = 0; i < a.length; i++) {
    scale = Math.max(scale, Math.abs(b[i]));
    diff = Math.max(diff, Math.abs(a[i] - b[i]));
  }
  return diff / scale;
}

Deno.test("RidgeAccumulator.solve() matches a float64 reference ridge to 1e-9 when streamed in chunks", async () => {
  const rand = mulberry32(7);
  const nIn = 13, nOut = 9, rows = 300;
  const x = new Float32Array(rows * nIn), y = new Float32Array(rows * nOut);
  for (let i = 0; i < x.length; i++) x[i] = randn(rand) + 0.5 * ((i % nIn) - 6) / 6;
  for (let i = 0; i < y.length; i++) y[i] = randn(rand) + 0.3;
  using acc = new RidgeAccumulator(nIn, nOut);
  // three uneven chunks: streaming must equal one pass
  for (const [r0, r1] of [[0, 70], [70, 71], [71, 300]]) {
    await acc.accumulate(x.slice(r0 * nIn, r1 * nIn), y.slice(r0 * nOut, r1 * nOut), r1 - r0, 2);
  }
  assert.equal(acc.rows, rows);
  for (
    const [sel, o0, oc, lambda] of [
      [[...Array(nIn).keys()], 0, nOut, 0],
      [[0, 2, 3, 7, 12], 2, 5, 0.1],
      [[5], 8, 1, 1e-3],
    ] as [number[], number, number, number][]
  ) {
    const got = acc.solve(sel, o0, oc, lambda);
    const want = referenceRidge(x, y, rows, nIn, nOut, sel, o0, oc, lambda);
    const ew = maxRel(got.w, want.w), eb = maxRel(got.bias, want.bias);
    console.log(
      `  sel ${sel.length} outputs ${oc} lambda ${lambda}: rel err w ${ew.toExponential(2)} bias ${
        eb.toExponential(2)
      }`,
    );
    assert.ok(ew < 1e-9 && eb < 1e-9, `w ${ew}, bias ${eb}`);
    // held-out SSE from statistics equals the direct sum over the same rows
    const { sse, sst } = acc.sse(sel, o0, got);
    for (let o = 0; o < oc; o++) {
      let direct = 0, mean = 0, ss = 0;
      for (let r = 0; r < rows; r++) mean += y[r * nOut + o0 + o] / rows;
      for (let r = 0; r < rows; r++) {
        let pred = got.bias[o];
        for (let a = 0; a < sel.length; a++) {
          pred += got.w[o * sel.length + a] * x[r * nIn + sel[a]];
        }
        direct += (y[r * nOut + o0 + o] - pred) ** 2;
        ss += (y[r * nOut + o0 + o] - mean) ** 2;
      }
      assert.ok(Math.abs(sse[o] - direct) <= 1e-8 * ss, `sse ${sse[o]} vs ${direct}`);
      assert.ok(Math.abs(sst[o] - ss) <= 1e-9 * ss, `sst ${sst[o]} vs ${ss}`);
    }
  }
});

Deno.test("RidgeAccumulator.solve() recovers a planted linear map when targets carry small noise", async () => {
  const rand = mulberry32(11);
  const nIn = 24, nOut = 16, rows = 2000;
  const wTrue = Float64Array.from({ length: nOut * nIn }, () => randn(rand));
  const bTrue = Float64Array.from({ length: nOut }, () => randn(rand));
  const x = new Float32Array(rows * nIn), y = new Float32Array(rows * nOut);
  for (let r = 0; r < rows; r++) {
    for (let i = 0; i < nIn; i++) x[r * nIn + i] = randn(rand);
    for (let o = 0; o < nOut; o++) {
      let v = bTrue[o] + 0.01 * randn(rand);
      for (let i = 0; i < nIn; i++) v += wTrue[o * nIn + i] * x[r * nIn + i];
      y[r * nOut + o] = v;
    }
  }
  using acc = new RidgeAccumulator(nIn, nOut);
  await acc.accumulate(x, y, rows);
  const sol = acc.solve([...Array(nIn).keys()], 0, nOut, 1e-8);
  const ew = maxRel(sol.w, wTrue), eb = maxRel(sol.bias, bTrue);
  console.log(`  planted map: max rel err W ${ew.toExponential(2)}, bias ${eb.toExponential(2)}`);
  assert.ok(ew < 2e-3 && eb < 2e-3);
});

Deno.test("RidgeAccumulator.solve() fails cleanly on collinear features at lambda 0 and is regularised by lambda > 0", async () => {
  const rand = mulberry32(3);
  const nIn = 4, nOut = 2, rows = 50;
  const x = new Float32Array(rows * nIn), y = new Float32Array(rows * nOut);
  for (let r = 0; r < rows; r++) {
    const a = randn(rand), b = randn(rand);
    x.set([a, b, a, 2 * b], r * nIn); // columns 2 and 3 duplicate 0 and 1
    y.set([a + b, a - b], r * nOut);
  }
  using acc = new RidgeAccumulator(nIn, nOut);
  await acc.accumulate(x, y, rows);
  assert.throws(
    () => acc.solve([0, 1, 2, 3], 0, 2, 0),
    (e: unknown) =>
      e instanceof EngineError && e.codeName === "INVALID_ARGUMENT" &&
      /positive definite/.test(e.message),
  );
  const sol = acc.solve([0, 1, 2, 3], 0, 2, 1e-6);
  assert.ok(sol.w.every(Number.isFinite));
  // non-finite input is refused, and bad selections are RangeErrors before FFI
  await assert.rejects(
    acc.accumulate(new Float32Array(4).fill(NaN), new Float32Array(2), 1),
    EngineError,
  );
  assert.throws(() => acc.solve([1, 0], 0, 1, 0.1), RangeError);
  assert.throws(() => acc.solve([0, 4], 0, 1, 0.1), RangeError);
  assert.throws(() => acc.solve([0], 1, 2, 0.1), RangeError);
  assert.throws(() => acc.solve([0], 0, 1, -1), RangeError);
  assert.throws(() => new RidgeAccumulator(0, 1), RangeError);
});

function cfg(
  layers: number,
  kvHeads: number,
  headDim: number,
  ropeTheta: number,
  scaling: ModelConfig["ropeScaling"] = null,
): ModelConfig {
  return {
    architecture: "Qwen3ForCausalLM",
    family: "qwen3",
    vocabSize: 64,
    hiddenSize: kvHeads * headDim,
    intermediateSize: 8,
    numLayers: layers,
    numHeads: kvHeads,
    numKvHeads: kvHeads,
    headDim,
    rmsNormEps: 1e-6,
    ropeTheta,
    ropeScaling: scaling,
    tieWordEmbeddings: true,
    attentionBias: false,
    mlpBias: false,
    maxPositionEmbeddings: 4096,
    bosTokenId: null,
    eosTokenIds: [],
  };
}

Deno.test("kvToFeatures() undoes the reference RoPE and kvFromFeatures() re-applies it (round trip)", () => {
  const rand = mulberry32(5);
  for (
    const c of [
      cfg(2, 2, 8, 10000),
      cfg(1, 3, 16, 500000, {
        type: "llama3",
        factor: 8,
        lowFreqFactor: 1,
        highFreqFactor: 4,
        originalMaxPosition: 64,
      }),
      cfg(1, 1, 4, 10000, { type: "linear", factor: 2 }),
    ]
  ) {
    const T = 5, start = 1000, D = c.headDim, H = c.numKvHeads, L = c.numLayers;
    const invFreq = ropeInvFreq(D, c.ropeTheta, c.ropeScaling);
    // pre-RoPE features (T, L*H*D) → reference-rotated cache block (L, H, T, D)
    const pre = Float32Array.from({ length: T * L * H * D }, () => randn(rand));
    const cache = new Float32Array(pre.length);
    for (let t = 0; t < T; t++) {
      for (let l = 0; l < L; l++) {
        for (let h = 0; h < H; h++) {
          const x = Float64Array.from(
            pre.subarray(t * L * H * D + (l * H + h) * D, t * L * H * D + (l * H + h + 1) * D),
          );
          applyRope(x, start + t, invFreq);
          cache.set(x, ((l * H + h) * T + t) * D);
        }
      }
    }
    const feats = kvToFeatures(c, start, T, cache, cache);
    let e1 = 0;
    for (let i = 0; i < pre.length; i++) e1 = Math.max(e1, Math.abs(feats.k[i] - pre[i]));
    const back = kvFromFeatures(c, start, T, feats.k, feats.v);
    let e2 = 0, e3 = 0;
    for (let i = 0; i < cache.length; i++) {
      e2 = Math.max(e2, Math.abs(back.k[i] - cache[i]));
      e3 = Math.max(e3, Math.abs(back.v[i] - cache[i])); // values: transposed back exactly
    }
    console.log(
      `  ${c.ropeScaling?.type ?? "default"} rope: de-rotate err ${
        e1.toExponential(2)
      }, round trip ${e2.toExponential(2)}`,
    );
    assert.ok(e1 < 2e-5 && e2 < 2e-5);
    assert.equal(e3, 0);
  }
  assert.throws(
    () => kvToFeatures(cfg(1, 1, 4, 10000), 0, 2, new Float32Array(3), new Float32Array(8)),
    RangeError,
  );
});

Deno.test("LinearKernel.apply() equals de-rotate → W·x + b → re-rotate computed in float64", async () => {
  const rand = mulberry32(9);
  const src = cfg(2, 1, 4, 10000), tgt = cfg(1, 2, 6, 50000);
  const ns = 8, nt = 12, T = 3, start = 17;
  const wk = Float32Array.from({ length: nt * ns }, () => randn(rand));
  const wv = Float32Array.from({ length: nt * ns }, () => randn(rand));
  const bk = Float32Array.from({ length: nt }, () => randn(rand));
  const bv = Float32Array.from({ length: nt }, () => randn(rand));
  using kern = new LinearKernel(src, tgt, wk, bk, wv, bv);
  const block = {
    k: Float32Array.from({ length: ns * T }, () => randn(rand)),
    v: Float32Array.from({ length: ns * T }, () => randn(rand)),
    tokens: T,
  };
  const out = await kern.apply(start, block);
  const fs = ropeInvFreq(4, 10000, null), ft = ropeInvFreq(6, 50000, null);
  let err = 0;
  for (let t = 0; t < T; t++) {
    // source features: per layer (1 head) de-rotate via rotation by −pos (apply at negative pos)
    const xk = new Float64Array(ns), xv = new Float64Array(ns);
    for (let l = 0; l < 2; l++) {
      const h = Float64Array.from(block.k.subarray((l * T + t) * 4, (l * T + t + 1) * 4));
      applyRope(h, -(start + t), fs);
      xk.set(h, l * 4);
      xv.set(block.v.subarray((l * T + t) * 4, (l * T + t + 1) * 4), l * 4);
    }
    for (let h = 0; h < 2; h++) {
      const yk = new Float64Array(6), yv = new Float64Array(6);
      for (let d = 0; d < 6; d++) {
        const o = h * 6 + d;
        yk[d] = bk[o];
        yv[d] = bv[o];
        for (let i = 0; i < ns; i++) {
          yk[d] += wk[o * ns + i] * xk[i];
          yv[d] += wv[o * ns + i] * xv[i];
        }
      }
      applyRope(yk, start + t, ft);
      for (let d = 0; d < 6; d++) {
        err = Math.max(
          err,
          Math.abs(out.k[(h * T + t) * 6 + d] - yk[d]),
          Math.abs(out.v[(h * T + t) * 6 + d] - yv[d]),
        );
      }
    }
  }
  console.log(`  linear projector vs float64 reference: max abs err ${err.toExponential(2)}`);
  assert.ok(err < 1e-4);
  assert.throws(() => new LinearKernel(src, tgt, wk.subarray(1), bk, wv, bv), RangeError);
  const bad = wk.slice();
  bad[0] = Infinity;
  assert.throws(() => new LinearKernel(src, tgt, bad, bk, wv, bv), EngineError);
});

Deno.test("LinearKernel.apply() gives identical results when applies overlap and free() waits for them", async () => {
  const rand = mulberry32(13);
  const src = cfg(2, 2, 8, 10000), tgt = cfg(3, 2, 8, 10000);
  const ns = 32, nt = 48, T = 64;
  const w = () => Float32Array.from({ length: nt * ns }, () => randn(rand) / 8);
  const b = () => Float32Array.from({ length: nt }, () => randn(rand));
  const kern = new LinearKernel(src, tgt, w(), b(), w(), b());
  const blocks = [0, 1, 2].map(() => ({
    k: Float32Array.from({ length: ns * T }, () => randn(rand)),
    v: Float32Array.from({ length: ns * T }, () => randn(rand)),
    tokens: T,
  }));
  const serial: CacheBlock[] = [];
  for (const [i, blk] of blocks.entries()) serial.push(await kern.apply(i * 100, blk));
  const pending = blocks.map((blk, i) => kern.apply(i * 100, blk));
  kern.free(); // deferred until the three settle
  const overlapped = await Promise.all(pending);
  overlapped.forEach((o, i) => {
    assert.deepEqual(o.k, serial[i].k);
    assert.deepEqual(o.v, serial[i].v);
  });
  await assert.rejects(kern.apply(0, blocks[0]), /freed/);
});
