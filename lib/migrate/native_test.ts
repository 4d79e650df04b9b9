// Tests of the native projection kernels against independent float64 references: ridge
// accumulation + Cholesky solve vs a plain two-pass centred normal-equation solve (Gaussian
// elimination), a planted linear map, ill-conditioned input, RoPE strip/re-apply vs
// tests/reference/forward.ts applyRope; and the sequence → sequence projection vs the
// JS-orchestrated block path (read, apply, write), with its argument checks.

import assert from "node:assert/strict";
import type { ModelConfig } from "../model/mod.ts";
import { applyRope, ropeInvFreq } from "../../tests/reference/forward.ts";
import { mulberry32, writeRandomCheckpoint } from "../../tests/fixtures/random_checkpoint.ts";
import { type LoadedModel, loadModel } from "../engine/mod.ts";
import type { NativeLibrary } from "../native/mod.ts";
import { openTestLibrary } from "../native/test_library.ts";
import {
  encodeModelParams,
  EngineError,
  type KvDtype,
  type NativeSequence,
  openNativeLibrary,
} from "../native/mod.ts";
import {
  type CacheBlock,
  featureWidth,
  kvFromFeatures,
  kvToFeatures,
  LinearKernel,
  readCacheBlock,
  RidgeAccumulator,
  writeCacheBlock,
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

// Two small random checkpoints of different geometry and RoPE for the sequence → sequence tests:
// source Qwen3 (2 layers, 2 kv heads, head_dim 16, theta 10000), target Llama (3 layers, 1 kv
// head, head_dim 32, theta 50000, linear scaling ×2).
async function seqPair(
  srcDtype: KvDtype,
  dstDtype: KvDtype,
  lib?: NativeLibrary,
): Promise<{ s: LoadedModel; t: LoadedModel; dirs: string[] }> {
  const ds = await Deno.makeTempDir({ prefix: "kvr-seqproj-" });
  const dt = await Deno.makeTempDir({ prefix: "kvr-seqproj-" });
  const base = { vocab: 4096, dtype: "F32" as const, tie: true, intermediate: 48 };
  await writeRandomCheckpoint(ds, {
    ...base,
    name: "src",
    architecture: "Qwen3ForCausalLM",
    hidden: 32,
    layers: 2,
    heads: 4,
    kvHeads: 2,
    headDim: 16,
    seed: 31,
  });
  await writeRandomCheckpoint(dt, {
    ...base,
    name: "dst",
    architecture: "LlamaForCausalLM",
    hidden: 64,
    layers: 3,
    heads: 2,
    kvHeads: 1,
    headDim: 32,
    ropeTheta: 50000,
    ropeScaling: { type: "linear", factor: 2 },
    seed: 32,
  });
  return {
    s: await loadModel(ds, { threads: 2, kvDtype: srcDtype, lib }),
    t: await loadModel(dt, { threads: 2, kvDtype: dstDtype, lib }),
    dirs: [ds, dt],
  };
}

function randomKernel(
  s: ModelConfig,
  t: ModelConfig,
  seed: number,
  lib?: NativeLibrary,
): LinearKernel {
  const rand = mulberry32(seed);
  const ns = featureWidth(s), nt = featureWidth(t);
  const w = () => Float32Array.from({ length: nt * ns }, () => randn(rand) / Math.sqrt(ns));
  const b = () => Float32Array.from({ length: nt }, () => randn(rand));
  return new LinearKernel(s, t, w(), b(), w(), b(), lib);
}

/** Every layer's K and V of [0, n) in the cache's own dtype, decoded to f32 by readCacheBlock. */
function snapshot(seq: NativeSequence, n: number): CacheBlock | null {
  return n === 0 ? null : readCacheBlock(seq, 0, n);
}

Deno.test("LinearKernel.applySeq() equals the JS-orchestrated read → apply → write path to f32 rounding for f32, bf16 and f16 caches", async () => {
  // Tolerance: both paths do the same f32 operations per element (same de-rotation in float64,
  // same packed GEMM whose sum over k runs in the same KC blocks whatever the row count, same
  // bias add, f32 rotation and rounding to the cache dtype), so they are expected to be
  // bit-identical. Chunking over tokens changes only which GEMM micro-kernel (tile height, or
  // the one-row GEMV path) computes a row; the bound allows those to differ by a few f32
  // roundings: |Δ| <= 8·2⁻²⁴·max|x| in f32 caches, plus one ulp of the cache dtype at |x|
  // (2⁻⁸·|x| bf16, 2⁻¹¹·|x| f16) where one f32 rounding can flip a final rounding.
  for (const [sd, dd] of [["f32", "f32"], ["bf16", "f16"], ["f16", "bf16"]] as const) {
    const { s, t, dirs } = await seqPair(sd, dd);
    try {
      using kern = randomKernel(s.native.config, t.native.config, 41);
      const n = 203; // chunks of 96, 96, 11 with 2 threads; 97 leaves a one-row chunk
      const ids = Array.from({ length: n }, (_, i) => (i * 7919 + 13) % 4096);
      using src = s.native.createSequence(n);
      await src.prefill(ids);
      const before = snapshot(src, n)!;
      const relUlp = dd === "f32" ? 0 : dd === "bf16" ? 2 ** -8 : 2 ** -11;
      for (const [count, threads] of [[n, 2], [97, 2], [1, 1], [n, 1]]) {
        using viaJs = t.native.createSequence(n);
        writeCacheBlock(viaJs, 0, await kern.apply(0, readCacheBlock(src, 0, count)));
        using direct = t.native.createSequence(n + 5);
        await kern.applySeq(src, direct, count, threads);
        assert.equal(direct.length, count);
        const a = readCacheBlock(viaJs, 0, count), b = readCacheBlock(direct, 0, count);
        let maxAbs = 0, diff = 0, bad = 0, same = true;
        for (const x of [a.k, a.v]) {
          for (let i = 0; i < x.length; i++) maxAbs = Math.max(maxAbs, Math.abs(x[i]));
        }
        for (const [x, y] of [[a.k, b.k], [a.v, b.v]]) {
          for (let i = 0; i < x.length; i++) {
            const d = Math.abs(x[i] - y[i]);
            if (!Object.is(x[i], y[i])) same = false;
            diff = Math.max(diff, d);
            if (d > 8 * 2 ** -24 * maxAbs + relUlp * Math.abs(x[i])) bad++;
          }
        }
        console.log(
          `  ${sd}→${dd} count ${count} threads ${threads}: max |Δ| ${diff.toExponential(2)} ` +
            `(max |x| ${maxAbs.toFixed(2)}), bit-identical ${same}`,
        );
        assert.equal(bad, 0, `${bad} elements outside the tolerance`);
      }
      // the source is only read
      const after = snapshot(src, n)!;
      assert.equal(src.length, n);
      assert.deepEqual(after.k, before.k);
      assert.deepEqual(after.v, before.v);
    } finally {
      s.native.free();
      t.native.free();
      for (const d of dirs) await Deno.remove(d, { recursive: true });
    }
  }
});

Deno.test("LinearKernel.applySeq() through the backend copy path writes the same bits as the CPU in-place path", async () => {
  // The test library's kvr_test_projector_apply_seq_via_copies is kvr_projector_apply_seq on the
  // backend-neutral path (kv_read → project → kv_write per chunk), the one a CUDA sequence takes.
  // Same chunks, same arithmetic: the caches must be bit-identical, in every dtype pair.
  // Models, sequences and the projector all come from the test library.
  const lib = openTestLibrary();
  for (const [sd, dd] of [["f32", "f32"], ["bf16", "f16"]] as const) {
    const { s, t, dirs } = await seqPair(sd, dd, lib);
    try {
      using kern = randomKernel(s.native.config, t.native.config, 43, lib);
      const n = 193; // chunks of 96, 96 and a one-row chunk
      using src = s.native.createSequence(n);
      await src.prefill(Array.from({ length: n }, (_, i) => (i * 104729 + 7) % 4096));
      using fast = t.native.createSequence(n);
      using copied = t.native.createSequence(n);
      await kern.applySeq(src, fast, n, 2);
      const status = await src.runWithHandle(
        "viaCopies",
        (sp) =>
          copied.runWithHandle(
            "viaCopies",
            (dp) =>
              Promise.resolve(
                lib.hooks.kvr_test_projector_apply_seq_via_copies(kern.pointer, sp, dp, n, 2),
              ),
          ),
      );
      lib.check(status, "kvr_test_projector_apply_seq_via_copies");
      assert.equal(copied.length, n);
      for (let layer = 0; layer < t.native.config.numLayers; layer++) {
        const a = fast.readKv(layer, 0, n), b = copied.readKv(layer, 0, n);
        assert.deepEqual(b.k, a.k, `K layer ${layer}`);
        assert.deepEqual(b.v, a.v, `V layer ${layer}`);
      }
    } finally {
      s.native.free();
      t.native.free();
      for (const d of dirs) await Deno.remove(d, { recursive: true });
    }
  }
});

Deno.test("LinearKernel.applySeq() throws typed errors and leaves both sequences unchanged for a wrong model, count or capacity", async () => {
  const { s, t, dirs } = await seqPair("f32", "f32");
  try {
    using kern = randomKernel(s.native.config, t.native.config, 43);
    const ids = Array.from({ length: 40 }, (_, i) => (i * 31 + 5) % 4096);
    using src = s.native.createSequence(64);
    await src.prefill(ids);
    using small = t.native.createSequence(16);
    using full = t.native.createSequence(64);
    await full.prefill(ids.slice(0, 8)); // a non-empty target
    using other = t.native.createSequence(64); // a target-model sequence given as the source
    await other.prefill(ids);
    using srcModelDst = s.native.createSequence(64); // a source-model sequence given as the target
    const state = () =>
      [src, small, full, other, srcModelDst].map((q) => ({
        length: q.length,
        kv: snapshot(q, q.length),
      }));
    const start = state();
    await assert.rejects(kern.applySeq(other, small, 8), TypeError); // wrong source model
    await assert.rejects(kern.applySeq(src, srcModelDst, 8), TypeError); // wrong target model
    await assert.rejects(kern.applySeq(src, small, 41), RangeError); // beyond the source
    await assert.rejects(kern.applySeq(src, small, 17), RangeError); // beyond the capacity
    await assert.rejects(kern.applySeq(src, full, 8), RangeError); // target not empty
    await assert.rejects(kern.applySeq(src, small, 0), RangeError);
    await assert.rejects(kern.applySeq(src, small, 1.5), RangeError);
    // a sequence that is busy: the call refuses instead of racing the prefill
    const busy = src.prefill([1]);
    await assert.rejects(kern.applySeq(src, small, 8), /still running/);
    await busy;
    src.truncate(40);
    assert.deepEqual(state(), start);

    // the native checks on their own (the TS checks above run first in normal use)
    const lib = openNativeLibrary();
    const params = (c: ModelConfig) => encodeModelParams(c, "f32", 0);
    const rand = mulberry32(44);
    const ns = featureWidth(s.native.config), nt = featureWidth(t.native.config);
    const w = Float32Array.from({ length: nt * ns }, () => randn(rand));
    const b = new Float32Array(nt);
    const big = (a: Float32Array) => BigInt(a.length);
    const create = (sc: ModelConfig) => {
      const out = new BigUint64Array(1);
      const st = lib.symbols.kvr_projector_create(
        params(sc),
        params(t.native.config),
        w,
        big(w),
        b,
        big(b),
        w,
        big(w),
        b,
        big(b),
        out,
      );
      lib.check(st, "kvr_projector_create");
      return Deno.UnsafePointer.create(out[0]);
    };
    const proj = create(s.native.config);
    // same KV geometry as the source model, other RoPE: refused on the frequencies alone
    const otherRope = create({ ...s.native.config, ropeTheta: 20000 });
    try {
      await src.runWithHandle("test", (ap) =>
        small.runWithHandle("test", async (dp) => {
          const st = await lib.symbols.kvr_projector_apply_seq(otherRope, ap, dp, 8, 0);
          assert.equal(st, -1);
          const p = lib.symbols.kvr_projector_last_error(otherRope);
          assert.match(p === null ? "" : Deno.UnsafePointerView.getCString(p), /RoPE differs/);
        }));
      const call = async (ap: Deno.PointerObject, dp: Deno.PointerObject, n: number) => {
        const st = await lib.symbols.kvr_projector_apply_seq(proj, ap, dp, n, 0);
        const p = lib.symbols.kvr_seq_last_error(dp);
        return { st, seqMsg: p === null ? "" : Deno.UnsafePointerView.getCString(p) };
      };
      // the same sequence on both sides (TS cannot even hold one sequence busy twice)
      const raw = (a: NativeSequence, d: NativeSequence, n: number) =>
        a === d
          ? a.runWithHandle("test", (ap) => call(ap, ap, n))
          : a.runWithHandle("test", (ap) => d.runWithHandle("test", (dp) => call(ap, dp, n)));
      const projMsg = () => {
        const p = lib.symbols.kvr_projector_last_error(proj);
        return p === null ? "" : Deno.UnsafePointerView.getCString(p);
      };
      for (
        const [name, a, d, n, status, re] of [
          ["wrong source model", other, small, 8, -1, /source sequence's model has layers 3/],
          ["same sequence", src, src, 8, -1, /source and target are the same sequence/],
          ["wrong target model", src, srcModelDst, 8, -1, /target sequence's model has layers 2/],
          ["n > source length", src, small, 41, -2, /n_tokens 41 exceeds .* length 40/],
          ["capacity too small", src, small, 17, -3, /n_tokens 17 exceeds .* capacity 16/],
          ["target not empty", src, full, 8, -1, /must be empty, holds 8 tokens/],
          ["zero tokens", src, small, 0, -1, /n_tokens is 0/],
        ] as const
      ) {
        const r = await raw(a, d, n);
        console.log(`  native ${name}: status ${r.st}, "${r.seqMsg}"`);
        assert.equal(r.st, status, name);
        assert.match(r.seqMsg, re, name);
        assert.match(projMsg(), re, name);
      }
      assert.deepEqual(state(), start);
      // and it works through the same raw handle once the arguments are right
      assert.equal((await raw(src, small, 16)).st, 0);
      assert.equal(small.length, 16);
    } finally {
      lib.symbols.kvr_projector_free(proj);
      lib.symbols.kvr_projector_free(otherRope);
    }
  } finally {
    s.native.free();
    t.native.free();
    for (const d of dirs) await Deno.remove(d, { recursive: true });
  }
});

Deno.test("LinearKernel.applySeq() holds both sequences busy and defers free() of the kernel and the source until it settles", async () => {
  const { s, t, dirs } = await seqPair("f32", "bf16");
  try {
    const kern = randomKernel(s.native.config, t.native.config, 45);
    const ids = Array.from({ length: 150 }, (_, i) => (i * 17 + 3) % 4096);
    const src = s.native.createSequence(150);
    await src.prefill(ids);
    using ref = t.native.createSequence(150);
    await kern.applySeq(src, ref, 150);
    const want = readCacheBlock(ref, 0, 150);
    using dst = t.native.createSequence(150);
    const pending = kern.applySeq(src, dst, 150);
    assert.throws(() => src.length, /still running/);
    assert.throws(() => dst.readKv(0, 0, 0), /still running/);
    kern.free(); // deferred: the native weights stay until the call settles
    src.free();
    await pending;
    const got = readCacheBlock(dst, 0, 150);
    assert.deepEqual(got.k, want.k);
    assert.deepEqual(got.v, want.v);
    assert.throws(() => src.length, /freed/);
    await assert.rejects(kern.applySeq(src, dst, 1), /freed/);
  } finally {
    s.native.free();
    t.native.free();
    for (const d of dirs) await Deno.remove(d, { recursive: true });
  }
});

Deno.test("LinearKernel.weights() returns the constructor's maps exactly: the packed → row-major conversion of the device upload", async () => {
  const { s, t, dirs } = await seqPair("f32", "f32");
  try {
    // Target widths 24 and 40 are not multiples of the 16-row panels: the last panel is partial.
    for (const [layers, headDim] of [[3, 8], [5, 8], [2, 16]]) {
      const sc = s.native.config;
      const tc = { ...t.native.config, numLayers: layers, numKvHeads: 1, headDim };
      const ns = featureWidth(sc), nt = featureWidth(tc);
      const rand = mulberry32(77 + layers);
      const wk = Float32Array.from({ length: nt * ns }, () => randn(rand));
      const wv = Float32Array.from({ length: nt * ns }, () => randn(rand));
      const b = new Float32Array(nt);
      using kern = new LinearKernel(sc, tc, wk, b, wv, b);
      assert.deepEqual(kern.weights("k"), wk, `k, ${nt} rows`);
      assert.deepEqual(kern.weights("v"), wv, `v, ${nt} rows`);
      assert.throws(() => kern.weights("x" as "k"), RangeError);
    }
  } finally {
    s.native.free();
    t.native.free();
    for (const d of dirs) await Deno.remove(d, { recursive: true });
  }
});
