// Tests of the native q8/q4 KV quantizer against a float64 reference quantizer written here:
// decoded values within the documented bounds (|err| <= s/2 plus f32 rounding), codes matching
// the reference except at rounding ties, corrupt scales rejected as SnapshotError, and the
// native CRC32C equal to the TypeScript one.

import assert from "node:assert/strict";
import { NativeKvCodec } from "./native_codec.ts";
import { SnapshotError } from "./errors.ts";
import { AXIS_PER_CHANNEL, AXIS_PER_TOKEN } from "./chunk_frame.ts";
import { crc32cUpdate } from "./crc32c.ts";
import { mulberry32 } from "../util/mod.ts";

const rng = mulberry32;

// KV-like data: gaussian-ish values with a few outlier channels (like real keys).
function kvBlock(h: number, t: number, d: number, seed: number): Float32Array {
  const r = rng(seed);
  const x = new Float32Array(h * t * d);
  for (let i = 0; i < x.length; i++) {
    const ch = i % d;
    const g = (r() + r() + r() - 1.5) * 2;
    x[i] = g * (ch % 7 === 0 ? 8 : 1);
  }
  return x;
}

/** float64 reference: per-group (indices) scale, decoded values. */
function refGroups(
  h: number,
  t: number,
  d: number,
  axis: number,
  group: number,
): number[][] {
  const groups: number[][] = [];
  if (axis === AXIS_PER_CHANNEL) {
    for (let hh = 0; hh < h; hh++) {
      for (let t0 = 0; t0 < t; t0 += group) {
        for (let dd = 0; dd < d; dd++) {
          const idx: number[] = [];
          for (let tt = t0; tt < Math.min(t, t0 + group); tt++) idx.push((hh * t + tt) * d + dd);
          groups.push(idx);
        }
      }
    }
  } else {
    for (let r = 0; r < h * t; r++) {
      for (let d0 = 0; d0 < d; d0 += group) {
        const idx: number[] = [];
        for (let dd = d0; dd < Math.min(d, d0 + group); dd++) idx.push(r * d + dd);
        groups.push(idx);
      }
    }
  }
  return groups;
}

function refQ8(x: Float32Array, groups: number[][]) {
  const out = new Float64Array(x.length), codes = new Int32Array(x.length);
  const scale = new Float64Array(x.length);
  for (const g of groups) {
    let amax = 0;
    for (const i of g) amax = Math.max(amax, Math.abs(x[i]));
    const s = amax / 127;
    for (const i of g) {
      const c = s > 0 ? Math.max(-127, Math.min(127, Math.round(x[i] / s))) : 0;
      codes[i] = c;
      out[i] = c * s;
      scale[i] = s;
    }
  }
  return { out, codes, scale };
}

function refQ4(x: Float32Array, groups: number[][]) {
  const out = new Float64Array(x.length), codes = new Int32Array(x.length);
  const scale = new Float64Array(x.length), mag = new Float64Array(x.length);
  for (const g of groups) {
    let lo = Infinity, hi = -Infinity;
    for (const i of g) {
      lo = Math.min(lo, x[i]);
      hi = Math.max(hi, x[i]);
    }
    const s = (hi - lo) / 15;
    for (const i of g) {
      const c = s > 0 ? Math.max(0, Math.min(15, Math.round((x[i] - lo) / s))) : 0;
      codes[i] = c;
      out[i] = lo + c * s;
      scale[i] = s;
      mag[i] = Math.max(Math.abs(lo), Math.abs(hi));
    }
  }
  return { out, codes, scale, mag };
}

const codec = new NativeKvCodec();
const SHAPES: [number, number, number][] = [[2, 256, 32], [1, 37, 64], [3, 5, 7], [1, 1, 1]];

Deno.test("`quantizeQ8()` stays within s/2 of the input for both axes (float64 reference)", () => {
  for (const [h, t, d] of SHAPES) {
    for (const axis of [AXIS_PER_CHANNEL, AXIS_PER_TOKEN]) {
      const x = kvBlock(h, t, d, h * 1000 + t * 10 + d + axis);
      const q = codec.quantizeQ8(x, h, t, d, axis);
      const y = codec.dequantizeQ8(q.codes, q.scales, h, t, d, axis);
      const ref = refQ8(x, refGroups(h, t, d, axis, axis === AXIS_PER_CHANNEL ? t : d));
      let mismatched = 0;
      for (let i = 0; i < x.length; i++) {
        const bound = ref.scale[i] * 0.5001 + 1e-30;
        assert(
          Math.abs(y[i] - x[i]) <= bound,
          `q8 ${[h, t, d]} axis ${axis} i ${i}: |${y[i]} - ${x[i]}| > ${bound}`,
        );
        if (q.codes[i] !== ref.codes[i]) {
          mismatched++;
          assert(Math.abs(q.codes[i] - ref.codes[i]) === 1, "codes differ by more than a tie");
        }
      }
      assert(mismatched <= Math.max(1, x.length / 1000), `${mismatched} codes differ`);
    }
  }
});

Deno.test("`quantizeQ4()` stays within s/2 of the input for both axes and odd sizes", () => {
  for (const [h, t, d] of SHAPES) {
    for (const axis of [AXIS_PER_CHANNEL, AXIS_PER_TOKEN]) {
      for (const group of [32, 5]) {
        const x = kvBlock(h, t, d, 7 + h * t * d + axis + group);
        const q = codec.quantizeQ4(x, h, t, d, axis, group);
        assert.equal(q.codes.length, Math.ceil(x.length / 2));
        if (x.length % 2) assert.equal(q.codes.at(-1)! >> 4, 0, "odd tail nibble must be 0");
        const y = codec.dequantizeQ4(q.codes, q.scales, q.mins, h, t, d, axis, group);
        const ref = refQ4(x, refGroups(h, t, d, axis, group));
        for (let i = 0; i < x.length; i++) {
          const bound = ref.scale[i] * 0.5001 + 2.5e-7 * ref.mag[i];
          assert(
            Math.abs(y[i] - x[i]) <= bound,
            `q4 ${[h, t, d]} axis ${axis} g ${group} i ${i}: |${y[i]} - ${x[i]}| > ${bound}`,
          );
          // nibble decode matches the reference code except at ties
          const c = (q.codes[i >> 1] >> ((i & 1) * 4)) & 15;
          assert(Math.abs(c - ref.codes[i]) <= 1);
        }
      }
    }
  }
});

Deno.test("`quantizeQ8()` maps an all-zero block to zero scales and codes", () => {
  const q = codec.quantizeQ8(new Float32Array(2 * 3 * 4), 2, 3, 4, AXIS_PER_TOKEN);
  assert(q.scales.every((s) => s === 0) && q.codes.every((c) => c === 0));
  const q4 = codec.quantizeQ4(new Float32Array(24).fill(1.5), 2, 3, 4, AXIS_PER_CHANNEL, 2);
  const y = codec.dequantizeQ4(q4.codes, q4.scales, q4.mins, 2, 3, 4, AXIS_PER_CHANNEL, 2);
  assert(y.every((v) => v === 1.5));
});

Deno.test("`dequantizeQ8()` rejects negative or NaN scales as a format SnapshotError", () => {
  const codes = new Int8Array(4);
  for (const bad of [-1, NaN, Infinity]) {
    assert.throws(
      () => codec.dequantizeQ8(codes, new Float32Array([1, bad]), 1, 2, 2, AXIS_PER_TOKEN),
      (e) => e instanceof SnapshotError && e.kind === "format",
    );
  }
  assert.throws(
    () =>
      codec.dequantizeQ4(
        new Uint8Array(2),
        new Float32Array([1, 1]),
        new Float32Array([NaN, 0]),
        1,
        2,
        2,
        AXIS_PER_TOKEN,
        2,
      ),
    SnapshotError,
  );
});

Deno.test("`quantizeQ8()` rejects non-finite input and wrong lengths before or in native code", () => {
  assert.throws(() => codec.quantizeQ8(new Float32Array([1, NaN]), 1, 1, 2, 0), Error);
  assert.throws(() => codec.quantizeQ8(new Float32Array(3), 1, 1, 2, 0), RangeError);
  assert.throws(() => codec.quantizeQ4(new Float32Array(2), 1, 1, 2, 0, 0), RangeError);
  assert.throws(() => codec.quantizeQ8(new Float32Array(2), 1, 1, 2, 2), RangeError);
});

Deno.test("`NativeKvCodec.crc32c()` equals the TypeScript CRC32C for any length, offset and seed", async () => {
  const { crc32c } = await import("./crc32c.ts");
  const data = new Uint8Array(70000).map((_, i) => (i * 2654435761) >>> 24);
  assert.equal(codec.crc32c(new TextEncoder().encode("123456789")), 0xe3069283);
  for (const [off, len] of [[0, 0], [0, 1], [3, 7], [1, 8], [5, 4097], [0, 70000], [13, 65521]]) {
    const view = data.subarray(off, off + len);
    assert.equal(codec.crc32c(view), crc32c(view), `offset ${off} length ${len}`);
    assert.equal(codec.crc32c(view, 0xdeadbeef), crc32cUpdate(view, 0xdeadbeef));
  }
});

Deno.test("`quantizeQ8()` flushes groups whose scale would be subnormal to zero (error < 127·FLT_MIN)", () => {
  const FLT_MIN = 2 ** -126;
  const x = new Float32Array([1e-40, -3e-39, 0, 2e-44, 1, -0.5, 0.25, 0]);
  const q = codec.quantizeQ8(x, 1, 2, 4, AXIS_PER_TOKEN);
  assert.equal(q.scales[0], 0);
  const y = codec.dequantizeQ8(q.codes, q.scales, 1, 2, 4, AXIS_PER_TOKEN);
  for (let i = 0; i < 4; i++) assert(Math.abs(y[i] - x[i]) < 127 * FLT_MIN);
  for (let i = 4; i < 8; i++) assert(Math.abs(y[i] - x[i]) <= q.scales[1] / 2);
  const q4 = codec.quantizeQ4(x, 1, 2, 4, AXIS_PER_TOKEN, 4);
  assert.equal(q4.scales[0], 0);
  const y4 = codec.dequantizeQ4(q4.codes, q4.scales, q4.mins, 1, 2, 4, AXIS_PER_TOKEN, 4);
  for (let i = 0; i < 4; i++) assert(Math.abs(y4[i] - x[i]) < 15 * FLT_MIN);
});
