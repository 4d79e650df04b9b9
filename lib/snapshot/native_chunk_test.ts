// Tests of the native chunk codec (kvr_seq_export_chunk / kvr_seq_import_chunk through
// nativeSource / nativeSink) against the reference chunk codec over readKv / writeKv
// (tests/reference/chunk.ts) as the oracle: identical snapshot bytes for every encoding and cache dtype, identical imported KV,
// damaged frames refused with the same SnapshotError kinds and nothing written.

import assert from "node:assert/strict";
import { type LoadedModel, loadModel } from "../engine/mod.ts";
import { EngineError, type NativeSequence } from "../native/mod.ts";
import { crc32c } from "./crc32c.ts";
import { SnapshotError } from "./errors.ts";
import { type CacheDtype, decodeHeader, PREFIX_BYTES, type SnapshotEncoding } from "./format.ts";
import { MemoryKv, rng } from "./kv_test_helper.ts";
import { nativeSink, nativeSource } from "./native_chunk.ts";
import { readKvSource, writeKvSink } from "../../tests/reference/chunk.ts";
import { NativeKvCodec } from "./native_codec.ts";
import {
  decodeSnapshot,
  encodeSnapshot,
  encodeSnapshotStream,
  type SnapshotMeta,
} from "./stream.ts";
import { geometryOf } from "./engine.ts";

const MODELS = new URL("../../models/", import.meta.url).pathname;
const codec = new NativeKvCodec();
const ENCODINGS: SnapshotEncoding[] = ["f32", "f16", "bf16", "q8", "q4"];

/** A sequence of `model` holding seeded KV-like values at positions [0, tokens). */
function filledSequence(model: LoadedModel, tokens: number, seed: number): NativeSequence {
  const c = model.native.config;
  const kv = MemoryKv.random(c.numLayers, c.numKvHeads, c.headDim, tokens, "f32", seed);
  const seq = model.native.createSequence(tokens);
  for (let l = 0; l < c.numLayers; l++) {
    const { k, v } = kv.readKv(l, 0, tokens, "f32");
    seq.writeKv(l, 0, tokens, k, v, "f32");
  }
  seq.setLength(tokens);
  return seq;
}

function metaOf(model: LoadedModel, tokens: number, offset = 0): SnapshotMeta {
  return {
    modelFingerprint: "11".repeat(32),
    tokenizerFingerprint: "22".repeat(32),
    geometry: geometryOf(model.native.config),
    cacheDtype: model.native.kvDtype,
    tokenIds: Array.from({ length: tokens }, (_, i) => (i * 7) % 4096),
    positionOffset: offset,
  };
}

function readAll(seq: NativeSequence, layers: number, count: number): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (let l = 0; l < layers; l++) {
    const { k, v } = seq.readKv(l, 0, count, "f32");
    out.push(k, v);
  }
  return out;
}

Deno.test("`nativeSource()` encodes the same snapshot bytes as the TypeScript codec for every encoding and cache dtype", async () => {
  for (const kvDtype of ["f32", "bf16", "f16"] as CacheDtype[]) {
    const model = await loadModel(`${MODELS}tiny-fast`, { kvDtype, threads: 1 });
    try {
      const seq = filledSequence(model, 77, 5);
      for (const encoding of ENCODINGS) {
        for (const [chunkTokens, groupSize, start] of [[16, 32, 0], [30, 5, 3], [77, 7, 0]]) {
          const n = 77 - start;
          const meta = metaOf(model, n, start);
          const opts = { encoding, chunkTokens, groupSize };
          const want = await encodeSnapshot(readKvSource(seq), meta, opts);
          const got = await encodeSnapshot(nativeSource(seq), meta, opts);
          assert.equal(got.length, want.length);
          assert(
            got.every((b, i) => b === want[i]),
            `${kvDtype} cache, ${encoding}, chunk ${chunkTokens}, group ${groupSize}, start ${start}`,
          );
          // the native encoder writing into slices of one array = into its own frames
          const parts: Uint8Array[] = [];
          for await (const p of encodeSnapshotStream(nativeSource(seq), meta, opts)) parts.push(p);
          let o = 0;
          assert(
            parts.every((p) => p.every((b) => b === got[o++])) && o === got.length,
            `stream: ${kvDtype} cache, ${encoding}, chunk ${chunkTokens}, start ${start}`,
          );
        }
      }
      seq.free();
    } finally {
      model.native.free();
    }
  }
});

Deno.test("`nativeSink()` imports the same KV as the TypeScript decoder for every encoding", async () => {
  for (const kvDtype of ["f32", "bf16"] as CacheDtype[]) {
    const model = await loadModel(`${MODELS}tiny-fast`, { kvDtype, threads: 1 });
    const L = model.native.config.numLayers;
    try {
      const seq = filledSequence(model, 45, 9);
      for (const encoding of ENCODINGS) {
        const bytes = await encodeSnapshot(nativeSource(seq), metaOf(model, 45), {
          encoding,
          chunkTokens: 16,
          groupSize: 6,
        });
        const a = model.native.createSequence(45), b = model.native.createSequence(45);
        await decodeSnapshot(bytes, { onHeader: () => nativeSink(a) }, { codec });
        await decodeSnapshot(bytes, { onHeader: () => writeKvSink(b) }, { codec });
        assert.equal(a.length, 45);
        assert.equal(b.length, 45);
        assert.deepEqual(readAll(a, L, 45), readAll(b, L, 45), `${kvDtype} cache, ${encoding}`);
        if (encoding === kvDtype) {
          assert.deepEqual(readAll(a, L, 45), readAll(seq, L, 45), `${encoding} is lossless`);
        }
        a.free();
        b.free();
      }
      seq.free();
    } finally {
      model.native.free();
    }
  }
});

/** Offset and length of chunk 0's unsigned frame in an unsigned snapshot. */
function chunk0(bytes: Uint8Array): { at: number; len: number } {
  const { header, layout } = decodeHeader(bytes.subarray(0, layout0(bytes)));
  return { at: layout.payloadStart + header.chunks[0].offset, len: header.chunks[0].length };
}

function layout0(bytes: Uint8Array): number {
  return PREFIX_BYTES + new DataView(bytes.buffer, bytes.byteOffset).getUint32(16, true);
}

function fixCrc(bytes: Uint8Array, at: number, len: number): void {
  new DataView(bytes.buffer, bytes.byteOffset).setUint32(
    at + len - 4,
    crc32c(bytes.subarray(at, at + len - 4)),
    true,
  );
}

Deno.test("`nativeSink()` refuses damaged chunks as checksum / format and writes nothing", async () => {
  const model = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  const L = model.native.config.numLayers;
  try {
    const seq = filledSequence(model, 20, 3);
    for (const encoding of ["f32", "q8", "q4"] as SnapshotEncoding[]) {
      const good = await encodeSnapshot(nativeSource(seq), metaOf(model, 20), {
        encoding,
        chunkTokens: 20,
      });
      const { at, len } = chunk0(good);
      const cases: [string, (b: Uint8Array) => void, SnapshotError["kind"], RegExp][] = [
        ["payload bit", (b) => (b[at + 40] ^= 1), "checksum", /chunk 0 checksum mismatch/],
        [
          "stored index",
          (b) => {
            b[at] = 1;
            fixCrc(b, at, len);
          },
          "format",
          /index 1\/20 tokens where the table expects 0\/20/,
        ],
      ];
      if (encoding !== "f32") {
        // the last layer's K scales: a negative scale is corrupt (only caught after layer 0
        // would have been written by a layer-at-a-time decoder)
        const layerBytes = (len - 12) / L;
        cases.push([
          "negative scale",
          (b) => {
            new DataView(b.buffer).setFloat32(at + 8 + (L - 1) * layerBytes + 4, -1, true);
            fixCrc(b, at, len);
          },
          "format",
          /scale 1 is -1/,
        ]);
      }
      for (const [what, damage, kind, message] of cases) {
        const bad = good.slice();
        damage(bad);
        const dst = model.native.createSequence(20);
        await assert.rejects(
          decodeSnapshot(bad, { onHeader: () => nativeSink(dst) }, { codec }),
          (e) => e instanceof SnapshotError && e.kind === kind && message.test(e.message),
          `${encoding}: ${what}`,
        );
        assert.equal(dst.length, 0, `${encoding}: ${what}: length unchanged`);
        // a fresh cache is zeroed: every position must still read 0
        dst.setLength(20);
        for (const block of readAll(dst, L, 20)) {
          assert(block.every((x) => x === 0), `${encoding}: ${what}: KV written`);
        }
        dst.setLength(0);
        // the TypeScript decoder agrees on the kind
        await assert.rejects(
          decodeSnapshot(bad, { onHeader: () => writeKvSink(dst) }, { codec }),
          (e) => e instanceof SnapshotError && e.kind === kind,
          `${encoding}: ${what} (TypeScript)`,
        );
        dst.free();
      }
    }
    seq.free();
  } finally {
    model.native.free();
  }
});

Deno.test("`exportChunkFrame()` refuses NaN KV under q8/q4 and bad arguments", async () => {
  const model = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  const c = model.native.config;
  try {
    const seq = filledSequence(model, 8, 1);
    const n = c.numKvHeads * c.headDim;
    const k = new Float32Array(n).fill(0.5);
    k[3] = NaN;
    seq.writeKv(2, 4, 1, new Uint8Array(k.buffer), new Uint8Array(n * 4), "f32");
    for (const [encoding, group] of [["q8", 0], ["q4", 32]] as const) {
      const frame = new Uint8Array(seq.chunkBytes(encoding, group, 8));
      assert.throws(
        () => seq.exportChunkFrame(encoding, group, 0, 0, 8, frame),
        (e) =>
          e instanceof EngineError && e.codeName === "INVALID_ARGUMENT" &&
          /layer 2: K holds NaN/.test(e.message),
      );
    }
    // lossless encodings carry the NaN as it is
    const f32 = new Uint8Array(seq.chunkBytes("f32", 0, 8));
    seq.exportChunkFrame("f32", 0, 0, 0, 8, f32);
    const frame = new Uint8Array(seq.chunkBytes("f32", 0, 8) + 1);
    assert.throws(
      () => seq.exportChunkFrame("f32", 0, 0, 0, 8, frame),
      (e) => e instanceof EngineError && /frame_len \d+, expected \d+/.test(e.message),
    );
    assert.throws(
      () => seq.exportChunkFrame("q4", 0, 0, 0, 8, frame),
      (e) => e instanceof EngineError && /q4 group_size 0 outside/.test(e.message),
    );
    assert.throws(
      () => seq.exportChunkFrame("q9" as SnapshotEncoding, 0, 0, 0, 8, frame),
      TypeError,
    );
    assert.throws(() => seq.exportChunkFrame("f32", 0, 0, 4, 5, f32), RangeError);
    const dst = model.native.createSequence(8);
    assert.throws(() => dst.importChunkFrame("f32", 0, 0, 1, 7, f32), RangeError); // start > length
    seq.free();
    dst.free();
  } finally {
    model.native.free();
  }
});

Deno.test("`nativeSink()` survives seeded in-frame mutations with recomputed CRCs: typed errors or the TypeScript decoder's KV", async () => {
  const model = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  const c = model.native.config;
  const L = c.numLayers;
  const r = rng(0xc0dec);
  const kinds: Record<string, number> = {};
  let imported = 0;
  try {
    const seq = filledSequence(model, 24, 11);
    for (const encoding of ENCODINGS) {
      const good = await encodeSnapshot(nativeSource(seq), metaOf(model, 24), {
        encoding,
        chunkTokens: 24,
        groupSize: 5,
      });
      const { at, len } = chunk0(good);
      for (let i = 0; i < 300; i++) {
        const bad = good.slice();
        // 1–4 random byte edits anywhere in the frame's head or payload, then a valid CRC, so
        // the native checks past the CRC (index, tokens, scales, mins, codes) see hostile bytes
        for (let e = 1 + Math.floor(r() * 4); e > 0; e--) {
          bad[at + Math.floor(r() * (len - 4))] = Math.floor(r() * 256);
        }
        if (r() < 0.9) fixCrc(bad, at, len);
        const dst = model.native.createSequence(24), oracle = model.native.createSequence(24);
        try {
          await decodeSnapshot(bad, { onHeader: () => nativeSink(dst) }, { codec });
          imported++;
          // what was accepted is exactly what the TypeScript decoder makes of the same bytes
          await decodeSnapshot(bad, { onHeader: () => writeKvSink(oracle) }, { codec });
          assert.deepEqual(readAll(dst, L, 24), readAll(oracle, L, 24), `${encoding} case ${i}`);
        } catch (e) {
          if (!(e instanceof SnapshotError)) throw new Error(`${encoding} case ${i}: ${e}`);
          kinds[e.kind] = (kinds[e.kind] ?? 0) + 1;
          assert.equal(dst.length, 0, `${encoding} case ${i}: length changed on ${e.kind}`);
        } finally {
          dst.free();
          oracle.free();
        }
      }
    }
    seq.free();
  } finally {
    model.native.free();
  }
  assert(
    kinds.checksum > 0 && kinds.format > 0 && imported > 0,
    JSON.stringify({ kinds, imported }),
  );
});

Deno.test("`nativeSink()` refuses values that are not finite, beyond 2^24 or overflow the cache's dtype, before writing, naming the element", async () => {
  const src = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  const half = await loadModel(`${MODELS}tiny-fast`, { kvDtype: "f16", threads: 1 });
  const L = src.native.config.numLayers;
  try {
    const seq = filledSequence(src, 16, 4);
    const f32 = await encodeSnapshot(nativeSource(seq), metaOf(src, 16), {
      encoding: "f32",
      chunkTokens: 16,
    });
    const { at, len } = chunk0(f32);
    const lastLayerV = at + 8 + (L - 1) * ((len - 12) / L) + (len - 12) / L / 2; // its V block
    const cases: [string, Uint8Array, LoadedModel, RegExp][] = [];
    for (
      const [what, value, model, message] of [
        [
          "NaN",
          NaN,
          src,
          /: chunk 0 layer 3 V, head 0, token position 0, dim 5: value nan is not finite; KV values must be finite$/,
        ],
        ["-Infinity", -Infinity, src, /dim 5: value -inf is not finite/],
        [
          "3e38 into f32",
          3e38,
          src,
          /layer 3 V, head 0, token position 0, dim 5: value 3e\+38 exceeds the KV magnitude bound 16777216 \(2\^24\)$/,
        ],
        ["2^24 + 2 into f32", 2 ** 24 + 2, src, /value 1\.67772e\+07 exceeds the KV magnitude/],
        ["1e5 into f16", 1e5, half, /dim 5: value 100000 overflows the f16 cache$/],
      ] as const
    ) {
      const bad = f32.slice();
      new DataView(bad.buffer).setFloat32(lastLayerV + 4 * 5, value, true);
      fixCrc(bad, at, len);
      cases.push([what, bad, model, message]);
    }
    for (const [what, bad, model, message] of cases) {
      const dst = model.native.createSequence(16);
      await assert.rejects(
        decodeSnapshot(bad, { onHeader: () => nativeSink(dst) }, { codec }),
        (e) => e instanceof SnapshotError && e.kind === "format" && message.test(e.message),
        what,
      );
      assert.equal(dst.length, 0, what);
      dst.setLength(16);
      for (const block of readAll(dst, L, 16)) {
        assert(block.every((x) => x === 0), `${what}: written`);
      }
      dst.free();
    }
    // The bound itself is accepted (by an f32 cache; an f16 cache overflows at 65520).
    const edge = f32.slice();
    new DataView(edge.buffer).setFloat32(lastLayerV + 4 * 5, -(2 ** 24), true);
    fixCrc(edge, at, len);
    const ok = src.native.createSequence(16);
    await decodeSnapshot(edge, { onHeader: () => nativeSink(ok) }, { codec });
    assert.equal(ok.length, 16);
    assert.equal(new Float32Array(ok.readKv(L - 1, 0, 16, "f32").v.buffer)[5], -(2 ** 24));
    ok.free();
    seq.free();
  } finally {
    src.native.free();
    half.native.free();
  }
});

Deno.test("`nativeSink()` checks each dequantized value when q8/q4 scales are too large to vouch for them", async () => {
  const f32 = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  const half = await loadModel(`${MODELS}tiny-fast`, { kvDtype: "f16", threads: 1 });
  const { numLayers: L, numKvHeads: H, headDim: D } = f32.native.config;
  const T = 16, G = 8; // one chunk of T tokens; q4 group size
  try {
    const seq = filledSequence(f32, T, 6);
    // The last layer's V block of chunk 0: per-token scales, then codes (heads, tokens, dim);
    // head 0 token 0 is scale 0 (q8) / group 0 (q4), its codes the first D elements.
    const encode = async (encoding: "q8" | "q4") => {
      const bytes = await encodeSnapshot(nativeSource(seq), metaOf(f32, T), {
        encoding,
        chunkTokens: T,
        groupSize: G,
      });
      const { at, len } = chunk0(bytes);
      const layer = (len - 12) / L;
      const kBlock = encoding === "q8" ? 4 * H * D + H * T * D : 8 * H * Math.ceil(T / G) * D +
        (H * T * D) / 2;
      return { bytes, at, len, v: at + 8 + (L - 1) * layer + kBlock };
    };
    const q8 = await encode("q8");
    const q4 = await encode("q4");
    const q4Groups = H * T * Math.ceil(D / G);
    // [what, encoded, edit of the frame, cache model, refusal message or the element's value]
    const cases: [
      string,
      typeof q8,
      (dv: DataView, v: number) => void,
      LoadedModel,
      RegExp | number,
    ][] = [
      [
        "q8 scale 1e30, codes 0, f16 cache",
        q8,
        (dv, v) => {
          dv.setFloat32(v, 1e30, true);
          for (let d = 0; d < D; d++) dv.setInt8(v + 4 * H * T + d, 0);
        },
        half,
        0,
      ],
      [
        "q8 scale 1e30, code 1, f16 cache",
        q8,
        (dv, v) => {
          dv.setFloat32(v, 1e30, true);
          for (let d = 0; d < D; d++) dv.setInt8(v + 4 * H * T + d, d === 3 ? 1 : 0);
        },
        half,
        /layer 3 V, head 0, token position 0, dim 3: value 1e\+30 exceeds the KV magnitude bound/,
      ],
      [
        "q8 scale 1e30, code 1, f32 cache",
        q8,
        (dv, v) => {
          dv.setFloat32(v, 1e30, true);
          for (let d = 0; d < D; d++) dv.setInt8(v + 4 * H * T + d, d === 3 ? 1 : 0);
        },
        f32,
        /layer 3 V, head 0, token position 0, dim 3: value 1e\+30 exceeds the KV magnitude bound/,
      ],
      [
        "q8 scale 2^17, code -128, f32 cache: -2^24, the bound",
        q8,
        (dv, v) => {
          dv.setFloat32(v, 2 ** 17, true);
          for (let d = 0; d < D; d++) dv.setInt8(v + 4 * H * T + d, d === 3 ? -128 : 0);
        },
        f32,
        -(2 ** 24),
      ],
      [
        "q8 scale 2^17 + 1, code -128, f32 cache",
        q8,
        (dv, v) => {
          dv.setFloat32(v, 2 ** 17 + 1, true);
          for (let d = 0; d < D; d++) dv.setInt8(v + 4 * H * T + d, d === 3 ? -128 : 0);
        },
        f32,
        /dim 3: value -1\.67773e\+07 exceeds the KV magnitude bound/,
      ],
      [
        "q8 scale 1e37, code -128, f32 cache",
        q8,
        (dv, v) => {
          dv.setFloat32(v, 1e37, true);
          for (let d = 0; d < D; d++) dv.setInt8(v + 4 * H * T + d, d === 3 ? -128 : 0);
        },
        f32,
        /layer 3 V, head 0, token position 0, dim 3: value -inf is not finite/,
      ],
      [
        "q4 min 60000 scale 400, codes 0, f16 cache",
        q4,
        (dv, v) => {
          dv.setFloat32(v, 400, true);
          dv.setFloat32(v + 4 * q4Groups, 60000, true);
          for (let b = 0; b < G / 2; b++) dv.setUint8(v + 8 * q4Groups + b, 0);
        },
        half,
        60000,
      ],
      [
        "q4 min 60000 scale 400, code 15, f16 cache",
        q4,
        (dv, v) => {
          dv.setFloat32(v, 400, true);
          dv.setFloat32(v + 4 * q4Groups, 60000, true);
          for (let b = 0; b < G / 2; b++) dv.setUint8(v + 8 * q4Groups + b, b === 1 ? 0xf0 : 0);
        },
        half,
        /layer 3 V, head 0, token position 0, dim 3: value 66000 overflows the f16 cache/,
      ],
    ];
    for (const [what, enc, edit, model, want] of cases) {
      const bad = enc.bytes.slice();
      edit(new DataView(bad.buffer), enc.v);
      fixCrc(bad, enc.at, enc.len);
      const dst = model.native.createSequence(T);
      if (want instanceof RegExp) {
        await assert.rejects(
          decodeSnapshot(bad, { onHeader: () => nativeSink(dst) }, { codec }),
          (e) => e instanceof SnapshotError && e.kind === "format" && want.test(e.message),
          what,
        );
        assert.equal(dst.length, 0, what);
      } else {
        await decodeSnapshot(bad, { onHeader: () => nativeSink(dst) }, { codec });
        assert.equal(dst.length, T, what);
        const v = new Float32Array(dst.readKv(L - 1, 0, T, "f32").v.buffer);
        assert.equal(v[3], want, what); // 60000 and 2^24 are exact in f16 resp. f32
      }
      dst.free();
    }
    seq.free();
  } finally {
    f32.native.free();
    half.native.free();
  }
});
