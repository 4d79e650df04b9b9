// Seeded mutation fuzz test of the snapshot decoder: 20,000+ mutated copies of small valid
// snapshots (every encoding, signed and unsigned). Each must either fail with a SnapshotError or
// decode to exactly what the unmutated snapshot decodes to: zero crashes, zero corrupted accepts.

import assert from "node:assert/strict";
import { SnapshotError } from "./errors.ts";
import type { SnapshotEncoding } from "./format.ts";
import { MemoryKv, rng } from "./kv_test_helper.ts";
import { NativeKvCodec } from "./native_codec.ts";
import { type DecodeOptions, decodeSnapshot, encodeSnapshot } from "./stream.ts";

const codec = new NativeKvCodec();
const KEY = new Uint8Array(32).map((_, i) => i * 13 + 1);
const CASES = Number(Deno.env.get("KVRELAY_FUZZ_CASES") ?? 20000);

interface Base {
  name: string;
  bytes: Uint8Array;
  src: MemoryKv;
  opts: DecodeOptions;
  /** canonical decode of the original: KV values and header ids */
  expect: string;
}

async function decodeCanonical(bytes: Uint8Array, like: MemoryKv, opts: DecodeOptions) {
  let kv: MemoryKv | null = null;
  const h = await decodeSnapshot(bytes, {
    onHeader(header) {
      if (header.tokenIds.length > 64) throw new Error("fuzz: decoder allowed a huge allocation");
      kv = new MemoryKv(like.layers, like.heads, like.headDim, header.tokenIds.length, like.dtype);
      return kv;
    },
  }, { codec, maxBytes: 1 << 20, ...opts });
  const k = kv as unknown as MemoryKv;
  const parts = [
    h.encoding,
    h.modelFingerprint,
    h.tokenizerFingerprint,
    h.positionOffset,
    [...h.tokenIds].join(","),
    [...h.pendingTokenIds].join(","),
    k.length,
  ];
  for (let l = 0; l < k.layers; l++) {
    parts.push(Array.from(k.k[l], (x) => Object.is(x, -0) ? "-0" : String(x)).join(","));
    parts.push(Array.from(k.v[l], (x) => Object.is(x, -0) ? "-0" : String(x)).join(","));
  }
  return parts.join("|");
}

async function makeBases(): Promise<Base[]> {
  const bases: Base[] = [];
  const encs: [SnapshotEncoding, "f32" | "bf16" | "f16"][] = [
    ["f32", "f32"],
    ["bf16", "bf16"],
    ["f16", "f16"],
    ["q8", "f32"],
    ["q4", "f32"],
  ];
  let seed = 1;
  for (const [enc, dtype] of encs) {
    for (const signed of [false, true]) {
      const src = MemoryKv.random(2, 1, 4, 10, dtype, seed++);
      const bytes = await encodeSnapshot(src, {
        modelFingerprint: "0f".repeat(32),
        tokenizerFingerprint: "e1".repeat(32),
        geometry: {
          architecture: 1,
          numLayers: 2,
          numKvHeads: 1,
          headDim: 4,
          rope: {
            theta: 10000,
            scaling: 0,
            factor: 1,
            lowFreqFactor: 1,
            highFreqFactor: 4,
            originalMaxPosition: 0,
          },
        },
        cacheDtype: dtype,
        tokenIds: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        pendingTokenIds: [11],
      }, {
        encoding: enc,
        chunkTokens: 4,
        groupSize: 3,
        sign: signed ? { keyId: "fuzz", key: KEY } : undefined,
      });
      const opts: DecodeOptions = signed ? { verify: { keys: { fuzz: KEY } } } : {};
      bases.push({
        name: `${enc}${signed ? "+hmac" : ""}`,
        bytes,
        src,
        opts,
        expect: await decodeCanonical(bytes, src, opts),
      });
    }
  }
  return bases;
}

const INTERESTING = [
  0,
  1,
  2,
  3,
  4,
  7,
  8,
  255,
  256,
  0x7fff,
  0xffff,
  0x10000,
  0x7fffffff,
  0x80000000,
  0xfffffffe,
  0xffffffff,
];

function mutate(src: Uint8Array, r: () => number): Uint8Array {
  const pick = (n: number) => Math.floor(r() * n);
  let b = src.slice();
  const rounds = 1 + pick(3);
  for (let k = 0; k < rounds; k++) {
    switch (pick(8)) {
      case 0: { // bit flip
        const i = pick(b.length);
        b[i] ^= 1 << pick(8);
        break;
      }
      case 1: // random byte
        b[pick(b.length)] = pick(256);
        break;
      case 2: { // interesting u32 at a 4-aligned offset in the first 256 bytes (header fields)
        const off = Math.min(b.length - 4, pick(64) * 4);
        if (off >= 0) {
          new DataView(b.buffer).setUint32(off, INTERESTING[pick(INTERESTING.length)], true);
        }
        break;
      }
      case 3: // truncate
        b = b.slice(0, pick(b.length));
        break;
      case 4: { // append garbage
        const extra = new Uint8Array(1 + pick(40)).map(() => pick(256));
        const n = new Uint8Array(b.length + extra.length);
        n.set(b);
        n.set(extra, b.length);
        b = n;
        break;
      }
      case 5: { // delete a range
        const i = pick(b.length), len = 1 + pick(16);
        b = new Uint8Array([...b.subarray(0, i), ...b.subarray(i + len)]);
        break;
      }
      case 6: { // duplicate a range (insert)
        const i = pick(b.length), len = 1 + pick(32);
        b = new Uint8Array([...b.subarray(0, i), ...b.subarray(i, i + len), ...b.subarray(i)]);
        break;
      }
      case 7: { // copy one range over another (moves table rows, chunk frames, tags)
        const len = 1 + pick(48);
        const from = pick(Math.max(1, b.length - len)), to = pick(Math.max(1, b.length - len));
        b.set(b.slice(from, from + len), to);
        break;
      }
    }
    if (b.length === 0) break;
  }
  return b;
}

Deno.test(`\`decodeSnapshot()\` survives ${CASES} seeded mutations: typed errors or the exact original`, async () => {
  const bases = await makeBases();
  const r = rng(0x5eed);
  const kinds: Record<string, number> = {};
  let accepted = 0;
  for (let c = 0; c < CASES; c++) {
    const base = bases[c % bases.length];
    const m = mutate(base.bytes, r);
    try {
      const got = await decodeCanonical(m, base.src, base.opts);
      assert.equal(got, base.expect, `case ${c} (${base.name}): a corrupted snapshot was accepted`);
      accepted++;
    } catch (e) {
      if (e instanceof SnapshotError) {
        kinds[e.kind] = (kinds[e.kind] ?? 0) + 1;
        continue;
      }
      throw new Error(`case ${c} (${base.name}): untyped failure ${e}`, { cause: e });
    }
  }
  console.log(
    `fuzz: ${CASES} cases, ${accepted} decoded to the original, errors ${JSON.stringify(kinds)}`,
  );
  assert(kinds.checksum > 0 && kinds.bounds > 0 && kinds.format > 0);
});
