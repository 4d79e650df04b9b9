// Tests of the snapshot format end to end on an in-memory KV cache (no engine): bit-exact round
// trips, quantized round trips within the float64-reference bounds, streaming behaviour, HMAC,
// and hostile inputs (truncation, bit flips, bad magic/version, overflowing dims, reordered chunk
// table, size limits) failing with typed SnapshotErrors.

import assert from "node:assert/strict";
import { concatBytes } from "../util/mod.ts";
import { crc32c, crc32cUpdate } from "./crc32c.ts";
import { SnapshotError, type SnapshotErrorKind } from "./errors.ts";
import {
  type CacheDtype,
  decodeHeader,
  HEADER_FIXED_BYTES,
  PREFIX_BYTES,
  type SnapshotEncoding,
  type SnapshotHeader,
} from "./format.ts";
import { NativeKvCodec } from "./native_codec.ts";
import {
  type DecodeOptions,
  decodeSnapshot,
  type EncodeOptions,
  encodeSnapshot,
  encodeSnapshotStream,
  type SnapshotMeta,
} from "./stream.ts";
import { MemoryKv } from "./kv_test_helper.ts";
import { referenceSource } from "../../tests/reference/chunk.ts";

const FP_MODEL = "ab".repeat(32);
const FP_TOK = "cd".repeat(32);
const codec = new NativeKvCodec();

function meta(kv: MemoryKv, n = kv.length): SnapshotMeta {
  return {
    modelFingerprint: FP_MODEL,
    tokenizerFingerprint: FP_TOK,
    geometry: {
      architecture: 3,
      numLayers: kv.layers,
      numKvHeads: kv.heads,
      headDim: kv.headDim,
      rope: {
        theta: 10000,
        scaling: 0,
        factor: 1,
        lowFreqFactor: 1,
        highFreqFactor: 4,
        originalMaxPosition: 256,
      },
    },
    cacheDtype: kv.dtype,
    tokenIds: Array.from({ length: n }, (_, i) => (i * 37) % 4096),
    pendingTokenIds: [7],
  };
}

async function decodeInto(
  bytes: Uint8Array | ReadableStream<Uint8Array>,
  like: MemoryKv,
  opts: DecodeOptions = {},
  checkAs?: CacheDtype,
): Promise<{ kv: MemoryKv; header: SnapshotHeader }> {
  let kv: MemoryKv | null = null;
  const header = await decodeSnapshot(bytes, {
    onHeader(h) {
      kv = new MemoryKv(like.layers, like.heads, like.headDim, h.tokenIds.length, like.dtype);
      kv.checkAs = checkAs;
      return kv;
    },
  }, { codec, ...opts });
  return { kv: kv!, header };
}

async function rejects(
  p: Promise<unknown>,
  kind: SnapshotErrorKind | SnapshotErrorKind[],
): Promise<SnapshotError> {
  const kinds = Array.isArray(kind) ? kind : [kind];
  try {
    await p;
  } catch (e) {
    assert(e instanceof SnapshotError, `expected SnapshotError, got ${e}`);
    assert(kinds.includes(e.kind), `expected kind ${kinds}, got ${e.kind}: ${e.message}`);
    return e;
  }
  assert.fail(`expected SnapshotError ${kinds}, but decoding succeeded`);
}

/** Recomputes the header CRC after a test edits prefix/header bytes. */
function fixHeaderCrc(b: Uint8Array): Uint8Array {
  const dv = new DataView(b.buffer, b.byteOffset);
  const hl = dv.getUint32(16, true);
  const end = Math.min(b.length, PREFIX_BYTES + hl);
  dv.setUint32(20, crc32cUpdate(b.subarray(PREFIX_BYTES, end), crc32c(b.subarray(0, 20))), true);
  return b;
}

for (const dtype of ["f32", "bf16", "f16"] as CacheDtype[]) {
  Deno.test(`\`encodeSnapshot()\` round-trips a ${dtype} cache bit-exactly with a partial tail chunk`, async () => {
    const src = MemoryKv.random(3, 2, 16, 600, dtype, 11);
    const bytes = await encodeSnapshot(src, meta(src), { chunkTokens: 256 });
    const { kv, header } = await decodeInto(bytes, src);
    assert.equal(header.encoding, dtype);
    assert.deepEqual(header.chunks.map((c) => c.tokens), [256, 256, 88]);
    assert.deepEqual([...header.tokenIds], [...meta(src).tokenIds as number[]]);
    assert.deepEqual([...header.pendingTokenIds], [7]);
    assert.equal(kv.length, 600);
    assert(kv.equalRange(src, 0, 600), "decoded KV differs from the source");
  });
}

async function concatStream(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  for await (const p of stream) parts.push(p);
  return concatBytes(parts);
}

Deno.test("`encodeSnapshot()` (chunks encoded in place) equals the stream's frames concatenated, every encoding, signed or not", async () => {
  const key = crypto.getRandomValues(new Uint8Array(32));
  for (const dtype of ["f32", "bf16"] as CacheDtype[]) {
    const src = MemoryKv.random(2, 2, 16, 70, dtype, 21);
    for (const encoding of ["f32", "bf16", "f16", "q8", "q4"] as SnapshotEncoding[]) {
      for (const sign of [undefined, { keyId: "k", key }]) {
        const opts: EncodeOptions = { encoding, chunkTokens: 32, groupSize: 8, sign };
        const got = await encodeSnapshot(src, meta(src), opts);
        const want = await concatStream(encodeSnapshotStream(src, meta(src), opts));
        assert.equal(got.length, want.length);
        assert(
          got.every((b, i) => b === want[i]),
          `${dtype} ${encoding} signed ${sign !== undefined}`,
        );
      }
    }
  }
});

Deno.test("`encodeSnapshot()` with f32 encoding of a bf16 cache decodes bit-exactly", async () => {
  const src = MemoryKv.random(2, 1, 8, 40, "bf16", 3);
  const bytes = await encodeSnapshot(src, meta(src), { encoding: "f32", chunkTokens: 16 });
  const { kv } = await decodeInto(bytes, src);
  assert(kv.equalRange(src, 0, 40));
});

// Reference bound per element, computed in float64 from the source values.
function quantBound(src: MemoryKv, enc: "q8" | "q4", chunk: number, group: number) {
  return (l: number, isK: boolean, h: number, t: number, d: number): number => {
    const arr = isK ? src.k[l] : src.v[l];
    const at = (tt: number, dd: number) => arr[(h * src.capacity + tt) * src.headDim + dd];
    const c0 = Math.floor(t / chunk) * chunk, c1 = Math.min(src.length, c0 + chunk);
    let vals: number[] = [];
    if (isK) {
      // keys: per channel over the chunk's tokens (q8) or token groups inside the chunk (q4)
      const g0 = enc === "q8" ? c0 : c0 + Math.floor((t - c0) / group) * group;
      const g1 = enc === "q8" ? c1 : Math.min(c1, g0 + group);
      for (let tt = g0; tt < g1; tt++) vals.push(at(tt, d));
    } else {
      const d0 = enc === "q8" ? 0 : Math.floor(d / group) * group;
      const d1 = enc === "q8" ? src.headDim : Math.min(src.headDim, d0 + group);
      for (let dd = d0; dd < d1; dd++) vals.push(at(t, dd));
    }
    if (enc === "q8") return Math.max(...vals.map(Math.abs)) / 254 * 1.0002;
    vals = vals.sort((a, b) => a - b);
    const lo = vals[0], hi = vals.at(-1)!;
    return (hi - lo) / 30 * 1.0002 + 2.5e-7 * Math.max(Math.abs(lo), Math.abs(hi));
  };
}

for (const enc of ["q8", "q4"] as const) {
  Deno.test(`\`encodeSnapshot()\` ${enc} decodes within the documented error bound`, async () => {
    const src = MemoryKv.random(2, 2, 24, 100, "f32", 5);
    const bytes = await encodeSnapshot(src, meta(src), {
      encoding: enc,
      chunkTokens: 64,
      groupSize: 16,
    });
    const { kv, header } = await decodeInto(bytes, src);
    assert.equal(header.groupSize, enc === "q4" ? 16 : 0);
    const bound = quantBound(src, enc, 64, 16);
    let worst = 0;
    for (let l = 0; l < 2; l++) {
      for (const isK of [true, false]) {
        for (let h = 0; h < 2; h++) {
          for (let t = 0; t < 100; t++) {
            for (let d = 0; d < 24; d++) {
              const i = (h * 100 + t) * 24 + d;
              const err = Math.abs((isK ? kv.k : kv.v)[l][i] - (isK ? src.k : src.v)[l][i]);
              const b = bound(l, isK, h, t, d);
              worst = Math.max(worst, err / b);
              assert(err <= b, `${enc} l${l} ${isK ? "K" : "V"} h${h} t${t} d${d}: ${err} > ${b}`);
            }
          }
        }
      }
    }
    assert(worst > 0.2, "quantization error suspiciously small: is the encoding applied?");
  });
}

Deno.test("`encodeSnapshotStream()` emits the header before reading any KV and one chunk per pull", async () => {
  const src = MemoryKv.random(2, 1, 8, 70, "f32", 9);
  let reads = 0;
  const counting = referenceSource({
    readKv: (l: number, s: number, c: number, d?: CacheDtype) => {
      reads++;
      return src.readKv(l, s, c, d);
    },
  }, { numLayers: 2, numKvHeads: 1, headDim: 8 });
  const reader = encodeSnapshotStream(counting, meta(src), { chunkTokens: 32 }).getReader();
  const first = await reader.read();
  assert.equal(reads, 0, "the header must leave before any chunk is encoded");
  assert(first.value!.length > PREFIX_BYTES + HEADER_FIXED_BYTES);
  await reader.read();
  assert.equal(reads, 2, "first chunk reads each of 2 layers once");
  let n = 1;
  while (!(await reader.read()).done) n++;
  assert.equal(n, 3); // 32 + 32 + 6 tokens
});

Deno.test("`decodeSnapshot()` imports each chunk as soon as its bytes arrive on a stream", async () => {
  const src = MemoryKv.random(2, 1, 8, 70, "bf16", 10);
  const bytes = await encodeSnapshot(src, meta(src), { chunkTokens: 32 });
  let push: ((b: Uint8Array | null) => void) | null = null;
  const stream = new ReadableStream<Uint8Array>({
    start(c) {
      push = (b) => b ? c.enqueue(b) : c.close();
    },
  });
  const seen: number[] = [];
  let dest: MemoryKv | null = null;
  const done = decodeSnapshot(stream, {
    onHeader(h) {
      dest = new MemoryKv(2, 1, 8, h.tokenIds.length, "bf16");
      return dest;
    },
    onChunk(i, tokens) {
      seen.push(tokens);
      void i;
    },
  });
  // deliver everything but the last chunk, in 7-byte pieces
  const chunkLen = 12 + 2 * 2 * 2 * 32 * 8;
  const lastStart = bytes.length - (12 + 2 * 2 * 2 * 6 * 8);
  for (let i = 0; i < lastStart; i += 7) push!(bytes.slice(i, Math.min(lastStart, i + 7)));
  await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(seen, [32, 64], "chunks 0 and 1 imported before the stream ended");
  assert.equal(dest!.length, 64);
  push!(bytes.slice(lastStart));
  push!(null);
  await done;
  assert.deepEqual(seen, [32, 64, 70]);
  assert(dest!.equalRange(src, 0, 70));
  assert(chunkLen > 0);
});

Deno.test("`decodeSnapshot()` rejects truncation at every chunk boundary and inside the header", async () => {
  const src = MemoryKv.random(2, 1, 8, 100, "f32", 12);
  const bytes = await encodeSnapshot(src, meta(src), { chunkTokens: 16 });
  const { header, layout } = await (async () => {
    let lay = null as unknown as { payloadStart: number };
    const h = await decodeSnapshot(bytes, {
      onHeader: (hh, l) => {
        lay = l;
        return new MemoryKv(2, 1, 8, hh.tokenIds.length, "f32");
      },
    });
    return { header: h, layout: lay };
  })();
  const cuts = [0, 5, PREFIX_BYTES, PREFIX_BYTES + 10, layout.payloadStart - 1];
  for (const c of header.chunks) {
    cuts.push(layout.payloadStart + c.offset, layout.payloadStart + c.offset + 5);
  }
  for (const cut of cuts) {
    await rejects(decodeInto(bytes.slice(0, cut), src), "bounds");
    // the same truncation arriving as a stream
    const s = new ReadableStream<Uint8Array>({
      start(ctl) {
        ctl.enqueue(bytes.slice(0, cut));
        ctl.close();
      },
    });
    await rejects(decodeInto(s, src), "bounds");
  }
  // one extra byte is a format error, not silently ignored
  const longer = new Uint8Array(bytes.length + 1);
  longer.set(bytes);
  await rejects(decodeInto(longer, src), "format");
});

Deno.test("`decodeSnapshot()` rejects wrong magic, unknown major version and unknown flags", async () => {
  const src = MemoryKv.random(1, 1, 4, 10, "f32", 1);
  const bytes = await encodeSnapshot(src, meta(src));
  const magic = bytes.slice();
  magic[1] = 0x4c;
  const e1 = await rejects(decodeInto(magic, src), "format");
  assert.match(e1.message, /magic/);
  const v2 = bytes.slice();
  new DataView(v2.buffer).setUint16(8, 2, true);
  const e2 = await rejects(decodeInto(fixHeaderCrc(v2), src), "version");
  assert.match(e2.message, /version 2\.0 is not supported/);
  const fl = bytes.slice();
  new DataView(fl.buffer).setUint32(12, 6, true);
  await rejects(decodeInto(fixHeaderCrc(fl), src), "format");
  // a newer minor of the same major still reads when it has the 1.1 provenance block...
  const withProvenance = await encodeSnapshot(src, {
    ...meta(src),
    provenance: { migrated: true, sourceModelFingerprint: "cd".repeat(32), repairTokens: 0 },
  });
  const minor = withProvenance.slice();
  new DataView(minor.buffer).setUint16(10, 3, true);
  const { kv, header } = await decodeInto(fixHeaderCrc(minor), src);
  assert(kv.equalRange(src, 0, 10));
  assert.equal(header.provenance?.sourceModelFingerprint, "cd".repeat(32));
  // ...and not without it (every minor from 1.1 on carries it)
  const bare = bytes.slice();
  new DataView(bare.buffer).setUint16(10, 3, true);
  await rejects(decodeInto(fixHeaderCrc(bare), src), "format");
});

Deno.test("`decodeSnapshot()` rejects overflowing or over-limit header fields before allocating", async () => {
  const src = MemoryKv.random(2, 1, 4, 20, "f32", 2);
  const bytes = await encodeSnapshot(src, meta(src), { chunkTokens: 8 });
  let allocated = 0;
  const tryField = async (off: number, value: number, kinds: SnapshotErrorKind[]) => {
    const b = bytes.slice();
    new DataView(b.buffer).setUint32(PREFIX_BYTES + off, value, true);
    try {
      await decodeSnapshot(fixHeaderCrc(b), {
        onHeader: () => {
          allocated++;
          return new MemoryKv(2, 1, 4, 20, "f32");
        },
      });
      assert.fail(`field at ${off} = ${value} accepted`);
    } catch (e) {
      assert(e instanceof SnapshotError && kinds.includes(e.kind), `${off}=${value}: ${e}`);
    }
  };
  await tryField(140, 0xffffffff, ["bounds"]); // n_tokens: 2^32-1 (2^40 does not fit a u32)
  await tryField(140, 2 ** 21, ["bounds"]);
  await tryField(144, 0xfffffff0, ["bounds"]); // n_pending
  await tryField(68, 0, ["bounds"]); // num_layers
  await tryField(68, 100000, ["bounds"]);
  await tryField(72, 0xffffffff, ["bounds"]); // kv heads
  await tryField(76, 4096, ["bounds"]); // head_dim
  await tryField(88, 0, ["bounds"]); // chunk_tokens
  await tryField(148, 7, ["format"]); // n_chunks disagrees
  await tryField(152, 64, ["format"]); // key id length without signed flag
  await tryField(84, 9, ["format"]); // encoding code
  await tryField(80, 3, ["format"]); // cache dtype code
  await tryField(136, 0xffffffff, ["bounds"]); // position offset overflow
  assert.equal(allocated, 0);
  // header_length itself: huge, tiny, and off by one
  for (const hl of [0xffffffff, 25 << 20, 10, HEADER_FIXED_BYTES + 1]) {
    const b = bytes.slice();
    new DataView(b.buffer).setUint32(16, hl, true);
    await rejects(decodeInto(fixHeaderCrc(b), src), ["bounds", "format"]);
  }
  // a header that is consistent but describes a snapshot above maxBytes
  await rejects(decodeInto(bytes, src, { maxBytes: bytes.length - 1 }), "too_large");
});

Deno.test("`decodeSnapshot()` rejects a chunk table out of order or with wrong lengths", async () => {
  const src = MemoryKv.random(1, 1, 4, 24, "f32", 4);
  const bytes = await encodeSnapshot(src, meta(src), { chunkTokens: 8 });
  const dv = new DataView(bytes.buffer);
  const nIds = 24 + 1;
  const table = PREFIX_BYTES + HEADER_FIXED_BYTES + 4 * nIds;
  // swap rows 0 and 1
  const swapped = bytes.slice();
  swapped.set(bytes.subarray(table, table + 16), table + 16);
  swapped.set(bytes.subarray(table + 16, table + 32), table);
  const e = await rejects(decodeInto(fixHeaderCrc(swapped), src), "format");
  assert.match(e.message, /out of order/);
  const len = bytes.slice();
  new DataView(len.buffer).setUint32(table + 8, dv.getUint32(table + 8, true) + 4, true);
  await rejects(decodeInto(fixHeaderCrc(len), src), "format");
  const big = bytes.slice();
  new DataView(big.buffer).setBigUint64(table + 16, 2n ** 62n, true);
  await rejects(decodeInto(fixHeaderCrc(big), src), "format");
});

Deno.test("`decodeSnapshot()` detects every single-bit flip (checksum or exact original)", async () => {
  const src = MemoryKv.random(1, 1, 4, 6, "bf16", 6);
  const bytes = await encodeSnapshot(src, meta(src), { chunkTokens: 4 });
  for (let i = 0; i < bytes.length; i++) {
    for (let bit = 0; bit < 8; bit++) {
      const b = bytes.slice();
      b[i] ^= 1 << bit;
      await rejects(decodeInto(b, src), ["checksum", "format", "version", "bounds", "too_large"]);
    }
  }
});

Deno.test("`decodeSnapshot()` verifies HMAC: good key accepted, tampering/wrong key/unsigned refused", async () => {
  const key = crypto.getRandomValues(new Uint8Array(32));
  const other = crypto.getRandomValues(new Uint8Array(32));
  const src = MemoryKv.random(2, 1, 8, 40, "f32", 7);
  const sign: EncodeOptions["sign"] = { keyId: "k1", key };
  const bytes = await encodeSnapshot(src, meta(src), { chunkTokens: 16, sign });
  const { kv, header } = await decodeInto(bytes, src, { verify: { keys: { k1: key } } });
  assert.equal(header.keyId, "k1");
  assert(kv.equalRange(src, 0, 40));
  // wrong key under the right id; unknown id
  await rejects(decodeInto(bytes, src, { verify: { keys: { k1: other } } }), "signature");
  await rejects(decodeInto(bytes, src, { verify: { keys: new Map([["k2", key]]) } }), "signature");
  // unsigned snapshot when a signature is required (default) / optional
  const plain = await encodeSnapshot(src, meta(src), { chunkTokens: 16 });
  await rejects(decodeInto(plain, src, { verify: { keys: { k1: key } } }), "signature");
  await decodeInto(plain, src, { verify: { keys: { k1: key }, required: false } });
  // payload changed with its CRC recomputed: only the HMAC can notice
  const { layout, header: h2 } = decodeHeader(bytes.subarray(0, bytes.length));
  const c0 = layout.payloadStart + h2.chunks[0].offset;
  const crcAt = c0 + h2.chunks[0].length - 32 - 4;
  const t = bytes.slice();
  t[c0 + 20] ^= 1;
  new DataView(t.buffer).setUint32(crcAt, crc32c(t.subarray(c0, crcAt)), true);
  await decodeInto(t, src); // CRC alone cannot tell
  await rejects(decodeInto(t, src, { verify: { keys: { k1: key } } }), "signature");
  // a chunk spliced in from another snapshot (other tokens) signed with the same key
  const src2 = MemoryKv.random(2, 1, 8, 40, "f32", 8);
  const meta2 = {
    ...meta(src2),
    tokenIds: meta(src2).tokenIds.length ? [...Array(40).keys()] : [],
  };
  const bytes2 = await encodeSnapshot(src2, meta2, { chunkTokens: 16, sign });
  const spliced = bytes.slice();
  spliced.set(bytes2.subarray(c0, c0 + h2.chunks[0].length), c0);
  await rejects(decodeInto(spliced, src, { verify: { keys: { k1: key } } }), "signature");
  // a tampered header tag
  const ht = bytes.slice();
  ht[layout.payloadStart - 1] ^= 0x80;
  await rejects(decodeInto(ht, src, { verify: { keys: { k1: key } } }), "signature");
});

Deno.test("`encodeSnapshot()` refuses bad fingerprints, token ids and sizes with TypeError/RangeError", async () => {
  const src = MemoryKv.random(1, 1, 4, 4, "f32", 1);
  await assert.rejects(
    encodeSnapshot(src, { ...meta(src), modelFingerprint: "xyz" }),
    TypeError,
  );
  await assert.rejects(encodeSnapshot(src, { ...meta(src), tokenIds: [1, -1, 2, 3] }), RangeError);
  await assert.rejects(encodeSnapshot(src, meta(src), { chunkTokens: 0 }), RangeError);
  await assert.rejects(
    encodeSnapshot(src, meta(src), { sign: { keyId: "k", key: new Uint8Array(4) } }),
    TypeError,
  );
});

export type { SnapshotEncoding };

Deno.test("`decodeSnapshot()` (TypeScript decoder) refuses KV beyond 2^24, non-finite or overflowing the cache, naming layer, K/V, head, token position and dim", async () => {
  // (layers 2, heads 2, tokens 40, dim 8); chunks of 16 tokens: position 20 is chunk 1's token 4.
  const plant = async (dtype: CacheDtype, part: "k" | "v", x: number, into?: CacheDtype) => {
    const kv = MemoryKv.random(2, 2, 8, 40, dtype, 5);
    kv[part][1][(1 * 40 + 20) * 8 + 3] = x; // layer 1, head 1, position 20, dim 3
    const bytes = await encodeSnapshot(kv, meta(kv), { encoding: dtype, chunkTokens: 16 });
    return decodeInto(bytes, kv, {}, into);
  };
  const at = "chunk 1 layer 1 V, head 1, token position 20, dim 3: value";
  for (
    const [what, p, message] of [
      [
        "f32 3e38",
        () => plant("f32", "v", 3e38),
        /exceeds the KV magnitude bound 16777216 \(2\^24\)$/,
      ],
      ["f32 -1e37", () => plant("f32", "v", -1e37), /exceeds the KV magnitude bound/],
      ["f32 2^24 + 2", () => plant("f32", "v", 2 ** 24 + 2), /value 16777218 exceeds/],
      ["bf16 1e30", () => plant("bf16", "v", 1e30), /exceeds the KV magnitude bound/],
      ["f32 NaN", () => plant("f32", "v", NaN), /value NaN is not finite/],
      ["f16 Inf", () => plant("f16", "v", Infinity), /value Infinity is not finite/],
      [
        "f32 1e5 into f16",
        () => plant("f32", "v", 1e5, "f16"),
        /value 100000 overflows the f16 cache$/,
      ],
    ] as const
  ) {
    const e = await rejects(p(), "format");
    assert.ok(e.message.startsWith(at), `${what}: ${e.message}`);
    assert.match(e.message, message, what);
  }
  const k = await rejects(plant("f32", "k", 3e38), "format");
  assert.match(k.message, /^chunk 1 layer 1 K, head 1, token position 20, dim 3/);
  // The bound itself and every finite f16 are accepted.
  const { kv } = await plant("f32", "v", -(2 ** 24));
  assert.equal(kv.v[1][(1 * 40 + 20) * 8 + 3], -(2 ** 24));
  await plant("f16", "v", 65504);
});
