// Tests for NativeSequence on the demo models: incremental decode vs batched prefill, truncate,
// independence and concurrency of sequences, argument checks before FFI, KV read/write round
// trips (bit-exact per cache dtype; conversion checked against a plain RNE reference).
// Needs the built library (`deno task build:native`, or KVRELAY_LIB).

import assert from "node:assert/strict";
import { NativeModel } from "./model.ts";
import { type NativeSequence, sequenceError } from "./sequence.ts";
import { openNativeLibrary } from "./library.ts";
import { encodeModelParams } from "./layout.ts";
import type { KvDtype } from "./dtype.ts";
import {
  assertClose,
  checkpoint,
  DEMO_DIRS,
  f32ToBf16Bits,
  rawModelLoad,
  tokens,
} from "./test_helpers.ts";

const TOL = 1e-4;

async function model(dir = DEMO_DIRS[0], kvDtype: KvDtype = "f32"): Promise<NativeModel> {
  return NativeModel.load(await checkpoint(dir), { kvDtype });
}

async function fresh(m: NativeModel, toks: number[], capacity = 64): Promise<Float32Array> {
  using s = m.createSequence(capacity);
  return await s.prefill(toks);
}

Deno.test("`prefill(N)` then `decode()` equals `prefill(N+1)` at the last position, each demo model", async () => {
  for (const dir of DEMO_DIRS) {
    using m = await model(dir);
    const toks = tokens(13, m.config.vocabSize, 7);
    using s = m.createSequence(32);
    await s.prefill(toks.slice(0, 12));
    const inc = await s.decode(toks[12]);
    assert.equal(s.length, 13);
    assertClose(inc, await fresh(m, toks), TOL, dir);
  }
});

Deno.test("`prefill()` with allPositions returns every row of the batched forward", async () => {
  using m = await model(DEMO_DIRS[1]);
  const V = m.config.vocabSize;
  const toks = tokens(6, V, 3);
  using s = m.createSequence(16);
  const all = await s.prefill(toks, { allPositions: true });
  assert.equal(all.length, 6 * V);
  for (const i of [0, 3, 5]) {
    assertClose(
      all.subarray(i * V, (i + 1) * V),
      await fresh(m, toks.slice(0, i + 1)),
      TOL,
      `row ${i}`,
    );
  }
});

Deno.test("`truncate()` then re-prefill equals a fresh prefill", async () => {
  using m = await model(DEMO_DIRS[2]);
  const V = m.config.vocabSize;
  const a = tokens(20, V, 11), b = tokens(5, V, 12);
  using s = m.createSequence(40);
  await s.prefill(a);
  s.truncate(8);
  assert.equal(s.length, 8);
  const got = await s.prefill(b);
  assertClose(got, await fresh(m, [...a.slice(0, 8), ...b]), TOL, "truncate 8 + 5");
  s.truncate(0);
  assertClose(await s.prefill(b), await fresh(m, b), TOL, "truncate 0");
  assert.throws(() => s.truncate(6), /truncate\(\): nTokens must be in \[0, 5\], got 6/);
});

Deno.test("two sequences of one model do not disturb each other when interleaved", async () => {
  using m = await model(DEMO_DIRS[0]);
  const V = m.config.vocabSize;
  const x = tokens(10, V, 21), y = tokens(7, V, 22);
  using a = m.createSequence(32);
  using b = m.createSequence(32);
  await a.prefill(x.slice(0, 5));
  await b.prefill(y.slice(0, 4));
  await a.prefill(x.slice(5, 9));
  const bl = await b.decode(y[4]);
  const al = await a.decode(x[9]);
  assertClose(al, await fresh(m, x), TOL, "sequence a");
  assertClose(bl, await fresh(m, y.slice(0, 5)), TOL, "sequence b");
  assert.deepEqual([a.length, b.length], [10, 5]);
});

Deno.test("concurrent prefill promises on two sequences give the serial results", async () => {
  using m = await model(DEMO_DIRS[2]);
  const V = m.config.vocabSize;
  const x = tokens(48, V, 31), y = tokens(40, V, 32);
  const serialX = await fresh(m, x), serialY = await fresh(m, y);
  using a = m.createSequence(64);
  using b = m.createSequence(64);
  const [lx, ly] = await Promise.all([a.prefill(x), b.prefill(y)]);
  assertClose(lx, serialX, TOL, "x");
  assertClose(ly, serialY, TOL, "y");
  const [dx, dy] = await Promise.all([a.decode(1), b.decode(2)]);
  assertClose(dx, await fresh(m, [...x, 1]), TOL, "decode x");
  assertClose(dy, await fresh(m, [...y, 2]), TOL, "decode y");
});

Deno.test("a second call on a sequence while one is in flight throws instead of racing", async () => {
  using m = await model(DEMO_DIRS[0]);
  using s = m.createSequence(64);
  const p = s.prefill(tokens(32, m.config.vocabSize, 5));
  assert.throws(() => s.length, /still running/);
  await assert.rejects(s.decode(1), /still running/);
  await p;
  assert.equal(s.length, 32);
});

Deno.test("`free()` during an in-flight prefill is deferred until it settles", async () => {
  using m = await model(DEMO_DIRS[0]);
  const s = m.createSequence(64);
  const p = s.prefill(tokens(32, m.config.vocabSize, 5));
  s.free();
  s.free();
  const logits = await p;
  assert.equal(logits.length, m.config.vocabSize);
  assert.throws(() => s.length, /has been freed/);
  await assert.rejects(s.decode(1), /has been freed/);
});

async function unchangedAfter(
  s: NativeSequence,
  m: NativeModel,
  prefix: number[],
  f: () => unknown,
) {
  try {
    await f();
  } catch (e) {
    assert.equal(s.length, prefix.length);
    const next = 17;
    assertClose(await s.decode(next), await fresh(m, [...prefix, next]), TOL, "after failure");
    s.truncate(prefix.length);
    throw e;
  }
  throw new Error("expected a failure");
}

Deno.test("capacity overflow throws RangeError and leaves the sequence unchanged", async () => {
  using m = await model(DEMO_DIRS[0]);
  const V = m.config.vocabSize;
  const prefix = tokens(6, V, 41);
  using s = m.createSequence(8);
  await s.prefill(prefix);
  await assert.rejects(
    unchangedAfter(s, m, prefix, () => s.prefill([1, 2, 3])),
    /capacity exceeded: length 6 \+ 3 tokens > capacity 8/,
  );
  await s.prefill([1, 2]);
  await assert.rejects(
    s.decode(3),
    (e: unknown) => e instanceof RangeError && /capacity 8/.test(e.message),
  );
  assert.equal(s.length, 8);
});

Deno.test("bad token ids and empty input throw before FFI and leave the sequence unchanged", async () => {
  using m = await model(DEMO_DIRS[0]);
  const V = m.config.vocabSize;
  const prefix = tokens(4, V, 51);
  using s = m.createSequence(16);
  await s.prefill(prefix);
  await assert.rejects(
    unchangedAfter(s, m, prefix, () => s.prefill([1, V])),
    (e: unknown) =>
      e instanceof RangeError &&
      e.message === `prefill(): tokens[1] must be in [0, ${V - 1}], got ${V}`,
  );
  await assert.rejects(unchangedAfter(s, m, prefix, () => s.prefill([-1])), RangeError);
  await assert.rejects(unchangedAfter(s, m, prefix, () => s.prefill([1.5])), TypeError);
  await assert.rejects(unchangedAfter(s, m, prefix, () => s.prefill([NaN])), TypeError);
  await assert.rejects(unchangedAfter(s, m, prefix, () => s.prefill([])), /tokens is empty/);
  await assert.rejects(unchangedAfter(s, m, prefix, () => s.decode(V + 10)), RangeError);
  await assert.rejects(s.prefill(null as unknown as number[]), TypeError);
  assert.equal(s.length, 4);
});

Deno.test("`readKv()`/`writeKv()` check layer, range, dtype and byte lengths before FFI", async () => {
  using m = await model(DEMO_DIRS[0]);
  const { numLayers: L, numKvHeads: H, headDim: D } = m.config;
  using s = m.createSequence(16);
  await s.prefill([1, 2, 3, 4]);
  assert.throws(() => s.readKv(L, 0, 1), RangeError);
  assert.throws(() => s.readKv(0, 2, 3), /count must be in \[0, 2\], got 3/);
  assert.throws(() => s.readKv(0, 0, 1, "f64" as KvDtype), TypeError);
  const { k, v } = s.readKv(0, 0, 0);
  assert.deepEqual([k.length, v.length], [0, 0]);
  const bytes = H * 2 * D * 4;
  assert.throws(
    () => s.writeKv(0, 0, 2, new Uint8Array(bytes - 1), new Uint8Array(bytes)),
    /k has \d+ bytes, expected/,
  );
  assert.throws(
    () => s.writeKv(0, 5, 1, new Uint8Array(H * D * 4), new Uint8Array(H * D * 4)),
    /start must be in \[0, 4\]/,
  );
  assert.throws(
    () => s.writeKv(0, 4, 13, new Uint8Array(0), new Uint8Array(0)),
    /count must be in \[0, 12\]/,
  );
  assert.throws(
    () => s.writeKv(0, 0, 1, [] as unknown as Uint8Array, new Uint8Array(H * D * 4)),
    TypeError,
  );
  assert.throws(() => s.setLength(17), RangeError);
});

for (const kvDtype of ["f32", "bf16", "f16"] as KvDtype[]) {
  Deno.test(`KV read → write into a fresh sequence is bit-exact and decodes identically (${kvDtype} cache)`, async () => {
    using m = await model(DEMO_DIRS[1], kvDtype);
    const { numLayers: L, vocabSize: V } = m.config;
    const toks = tokens(9, V, 61);
    using src = m.createSequence(32);
    await src.prefill(toks);
    using dst = m.createSequence(32);
    const saved = [];
    for (let l = 0; l < L; l++) {
      const kv = src.readKv(l, 0, 9);
      saved.push(kv);
      dst.writeKv(l, 0, 9, kv.k, kv.v);
    }
    dst.setLength(9);
    for (let l = 0; l < L; l++) {
      const back = dst.readKv(l, 0, 9);
      assert.deepEqual(back.k, saved[l].k, `layer ${l} k`);
      assert.deepEqual(back.v, saved[l].v, `layer ${l} v`);
    }
    const a = await src.decode(42), b = await dst.decode(42);
    assertClose(b, a, 1e-6, "decode after import");
  });
}

Deno.test("`writeKv()` appends a range at start = length, and partial reads match full reads", async () => {
  using m = await model(DEMO_DIRS[0], "bf16");
  const { numLayers: L, numKvHeads: H, headDim: D, vocabSize: V } = m.config;
  const toks = tokens(10, V, 71);
  using src = m.createSequence(16);
  await src.prefill(toks);
  using dst = m.createSequence(16);
  for (let l = 0; l < L; l++) {
    const kv = src.readKv(l, 0, 6);
    dst.writeKv(l, 0, 6, kv.k, kv.v);
  }
  dst.setLength(6);
  for (let l = 0; l < L; l++) {
    const kv = src.readKv(l, 6, 4);
    dst.writeKv(l, 6, 4, kv.k, kv.v);
  }
  dst.setLength(10);
  for (let l = 0; l < L; l++) {
    assert.deepEqual(dst.readKv(l, 0, 10), src.readKv(l, 0, 10));
    // a partial read equals the matching slice of a full read (layout (kv_heads, count, head_dim))
    const full = src.readKv(l, 0, 10).k, part = src.readKv(l, 3, 5).k;
    for (let h = 0; h < H; h++) {
      assert.deepEqual(
        part.subarray(h * 5 * D * 2, (h + 1) * 5 * D * 2),
        full.subarray((h * 10 + 3) * D * 2, (h * 10 + 8) * D * 2),
      );
    }
  }
  assertClose(await dst.decode(5), await src.decode(5), 1e-6, "decode");
});

Deno.test("`readKv()` of an f32 cache as bf16 equals round-to-nearest-even of the f32 values", async () => {
  using m = await model(DEMO_DIRS[0], "f32");
  using s = m.createSequence(8);
  await s.prefill(tokens(5, m.config.vocabSize, 81));
  for (let l = 0; l < m.config.numLayers; l++) {
    const f = s.readKv(l, 0, 5), b = s.readKv(l, 0, 5, "bf16");
    for (const [full, half] of [[f.k, b.k], [f.v, b.v]]) {
      const f32 = new Float32Array(full.buffer);
      const bf = new Uint16Array(half.buffer);
      assert.equal(bf.length, f32.length);
      for (let i = 0; i < f32.length; i++) {
        if (bf[i] !== f32ToBf16Bits(f32[i])) {
          throw new Error(
            `layer ${l} element ${i}: ${f32[i]} → ${bf[i].toString(16)}, want ${
              f32ToBf16Bits(f32[i]).toString(16)
            }`,
          );
        }
      }
    }
  }
});

// A buffer of `dtype` holding the values x (f16: Float16Array's RNE; bf16: the plain RNE reference).
function bytesOf(dtype: KvDtype, x: Float32Array): Uint8Array {
  if (dtype === "f32") return new Uint8Array(x.slice().buffer);
  if (dtype === "f16") return new Uint8Array(Float16Array.from(x).buffer);
  return new Uint8Array(Uint16Array.from(x, f32ToBf16Bits).buffer);
}

// What a value becomes when stored as `dtype`.
function roundAs(dtype: KvDtype, x: Float32Array): Float32Array {
  if (dtype === "f32") return x.slice();
  if (dtype === "f16") return Float32Array.from(Float16Array.from(x));
  return new Float32Array(
    Uint32Array.from(Uint16Array.from(x, f32ToBf16Bits), (h) => h << 16).buffer,
  );
}

Deno.test("`writeKv()`/`readKv()` convert between every buffer and cache dtype by round-to-nearest-even, aligned or not", async () => {
  const dtypes: KvDtype[] = ["f32", "bf16", "f16"];
  let state = 12345;
  const next = () => (state = (Math.imul(state, 1103515245) + 12345) >>> 0) / 2 ** 32;
  for (const cache of dtypes) {
    using m = await model(DEMO_DIRS[0], cache);
    const { numKvHeads: H, headDim: D } = m.config;
    const n = H * 7 * D;
    for (const buffer of dtypes) {
      for (const offset of [0, 2]) {
        // magnitudes from f16 subnormals (1e-7) to near the f16 maximum, both signs
        const x = Float32Array.from(
          { length: n },
          () => (next() < 0.5 ? -1 : 1) * 10 ** (next() * 11.8 - 7),
        );
        const pad = (b: Uint8Array) => {
          const out = new Uint8Array(b.length + offset).subarray(offset);
          out.set(b);
          return out;
        };
        using s = m.createSequence(8);
        s.setLength(1); // a run that does not start at position 0
        s.writeKv(0, 1, 7, pad(bytesOf(buffer, x)), pad(bytesOf(buffer, x.map((v) => -v))), buffer);
        s.setLength(8);
        const stored = roundAs(cache, roundAs(buffer, x)); // the buffer's value, rounded into the cache
        for (const out of dtypes) {
          const got = s.readKv(0, 1, 7, out);
          const want = bytesOf(out, stored), wantV = bytesOf(out, stored.map((v) => -v));
          const what = `${buffer} buffer (offset ${offset}) → ${cache} cache → ${out}`;
          assert.deepEqual(got.k, want, `${what}: K`);
          assert.deepEqual(got.v, wantV, `${what}: V`);
        }
      }
    }
  }
});

Deno.test("`sequenceError()` reads a nonblocking call's message from the sequence, not the thread", async () => {
  // Drive the raw symbols (bypassing the TS checks) so the native side itself refuses a token.
  const lib = openNativeLibrary();
  const ckpt = await checkpoint(DEMO_DIRS[0]);
  const loaded = rawModelLoad(lib, ckpt, encodeModelParams(ckpt.config, "f32", 1));
  assert.equal(loaded.status, 0, lib.lastError());
  const model = loaded.model!;
  const out = new BigUint64Array(1);
  assert.equal(lib.symbols.kvr_seq_create(model, 8, out), 0);
  const seq = Deno.UnsafePointer.create(out[0]);
  try {
    const V = ckpt.config.vocabSize;
    const ids = new Int32Array([1, V + 5]);
    const logits = new Float32Array(V);
    const status = await lib.symbols.kvr_seq_prefill(seq, ids, 2n, 0, logits, BigInt(V));
    const e = sequenceError(lib, seq, status, "kvr_seq_prefill");
    assert.equal(e.code, -2);
    assert.equal(e.codeName, "OUT_OF_RANGE");
    assert.match(
      e.message,
      new RegExp(`^kvr_seq_prefill failed \\(OUT_OF_RANGE, -2\\): .*${V + 5}`),
    );
    assert.equal(lib.symbols.kvr_seq_length(seq), 0);
  } finally {
    lib.symbols.kvr_seq_free(seq);
    lib.symbols.kvr_model_free(model);
  }
});
