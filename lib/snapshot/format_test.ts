// Tests of the header codec against the worked example in docs/snapshot-format.md (a hand-checked
// known answer) and of decodeHeader's field parsing.

import assert from "node:assert/strict";
import { crc32c, crc32cUpdate } from "./crc32c.ts";
import type { SnapshotError } from "./errors.ts";
import { decodeHeader } from "./format.ts";
import { encodeSnapshot } from "./stream.ts";
import { referenceSource } from "../../tests/reference/chunk.ts";

const DOC = new URL("../../docs/snapshot-format.md", import.meta.url).pathname;

async function docExample(): Promise<Uint8Array> {
  const md = await Deno.readTextFile(DOC);
  const block = md.split("```hex\n")[1].split("```")[0];
  const bytes: number[] = [];
  for (const line of block.trim().split("\n")) {
    for (const b of line.trim().split(/\s+/).slice(1)) bytes.push(parseInt(b, 16));
  }
  return new Uint8Array(bytes);
}

const exampleSource = referenceSource({
  readKv(_l: number, s: number, c: number) {
    const k = new Float32Array([1, 2, 3, 4]).slice(s * 2, (s + c) * 2);
    const v = new Float32Array([0.5, -0.5, 0.25, -0.25]).slice(s * 2, (s + c) * 2);
    return { k: new Uint8Array(k.buffer), v: new Uint8Array(v.buffer) };
  },
}, { numLayers: 1, numKvHeads: 1, headDim: 2 });

Deno.test("`encodeSnapshot()` reproduces the worked example of docs/snapshot-format.md byte for byte", async () => {
  const bytes = await encodeSnapshot(exampleSource, {
    modelFingerprint: "11".repeat(32),
    tokenizerFingerprint: "22".repeat(32),
    geometry: {
      architecture: 1,
      numLayers: 1,
      numKvHeads: 1,
      headDim: 2,
      rope: {
        theta: 10000,
        scaling: 0,
        factor: 1,
        lowFreqFactor: 0,
        highFreqFactor: 0,
        originalMaxPosition: 0,
      },
    },
    cacheDtype: "f32",
    tokenIds: [72, 105],
    pendingTokenIds: [33],
  }, { chunkTokens: 2 });
  assert.deepEqual(bytes, await docExample());
});

Deno.test("`decodeHeader()` reads every field of the worked example", async () => {
  const { header, layout } = decodeHeader(await docExample());
  assert.equal(layout.headerLength, 184);
  assert.equal(layout.payloadStart, 208);
  assert.equal(layout.totalBytes, 252);
  assert.equal(header.modelFingerprint, "11".repeat(32));
  assert.equal(header.tokenizerFingerprint, "22".repeat(32));
  assert.deepEqual([...header.tokenIds], [72, 105]);
  assert.deepEqual([...header.pendingTokenIds], [33]);
  assert.deepEqual(header.chunks, [{ offset: 0, length: 44, tokens: 2 }]);
  assert.equal(header.geometry.rope.theta, 10000);
  assert.equal(header.encoding, "f32");
  assert.equal(header.keyId, null);
});

// Format 1.1 appends a 40-byte provenance block after the chunk table. The oracle is the 1.0
// worked example patched by hand: minor 1, header_length + 40, the block, the header CRC redone.
function withProvenanceByHand(v10: Uint8Array, block: Uint8Array): Uint8Array {
  const headerEnd = 24 + 184;
  const out = new Uint8Array(v10.length + block.length);
  out.set(v10.subarray(0, headerEnd));
  out.set(block, headerEnd);
  out.set(v10.subarray(headerEnd), headerEnd + block.length);
  const dv = new DataView(out.buffer);
  dv.setUint16(10, 1, true);
  dv.setUint32(16, 184 + block.length, true);
  const crc = crc32cUpdate(out.subarray(24, headerEnd + block.length), crc32c(out.subarray(0, 20)));
  dv.setUint32(20, crc, true);
  return out;
}

function provenanceBlock(flags: number, fingerprintByte: number, repair: number): Uint8Array {
  const b = new Uint8Array(40);
  const dv = new DataView(b.buffer);
  dv.setUint32(0, flags, true);
  b.fill(fingerprintByte, 4, 36);
  dv.setUint32(36, repair, true);
  return b;
}

const exampleMeta = {
  modelFingerprint: "11".repeat(32),
  tokenizerFingerprint: "22".repeat(32),
  geometry: {
    architecture: 1,
    numLayers: 1,
    numKvHeads: 1,
    headDim: 2,
    rope: {
      theta: 10000,
      scaling: 0 as const,
      factor: 1,
      lowFreqFactor: 0,
      highFreqFactor: 0,
      originalMaxPosition: 0,
    },
  },
  cacheDtype: "f32" as const,
  tokenIds: [72, 105],
  pendingTokenIds: [33],
};

Deno.test("`encodeSnapshot()` with provenance writes format 1.1: the 1.0 example plus the block", async () => {
  const bytes = await encodeSnapshot(exampleSource, {
    ...exampleMeta,
    provenance: { migrated: true, sourceModelFingerprint: "AB".repeat(32), repairTokens: 1 },
  }, { chunkTokens: 2 });
  assert.deepEqual(bytes, withProvenanceByHand(await docExample(), provenanceBlock(1, 0xab, 1)));
  const { header, layout } = decodeHeader(bytes);
  assert.equal(header.versionMinor, 1);
  assert.equal(layout.headerLength, 224);
  assert.deepEqual(header.provenance, {
    migrated: true,
    sourceModelFingerprint: "ab".repeat(32),
    repairTokens: 1,
  });
  assert.equal(decodeHeader(await docExample()).header.provenance, undefined, "1.0: none");
});

Deno.test("`decodeHeader()` reads provenance of newer minors, refuses unknown provenance flags and a repair count above the pending tokens", async () => {
  const v10 = await docExample();
  // 1.2: the 1.1 block followed by 8 bytes this reader does not know.
  const newer = withProvenanceByHand(
    v10,
    new Uint8Array([...provenanceBlock(0, 0x11, 0), 1, 2, 3, 4, 5, 6, 7, 8]),
  );
  new DataView(newer.buffer).setUint16(10, 2, true);
  const dv = new DataView(newer.buffer);
  dv.setUint32(
    20,
    crc32cUpdate(newer.subarray(24, 24 + 184 + 48), crc32c(newer.subarray(0, 20))),
    true,
  );
  assert.deepEqual(decodeHeader(newer).header.provenance, {
    migrated: false,
    sourceModelFingerprint: "11".repeat(32),
    repairTokens: 0,
  });
  assert.throws(
    () => decodeHeader(withProvenanceByHand(v10, provenanceBlock(2, 0x11, 0))),
    (e: SnapshotError) => e.kind === "format" && /provenance flag/.test(e.message),
  );
  assert.throws(
    () => decodeHeader(withProvenanceByHand(v10, provenanceBlock(1, 0x11, 2))),
    (e: SnapshotError) => e.kind === "format" && /repair tokens 2 exceed/.test(e.message),
  );
  // 1.1 without its block: the length no longer matches the contents.
  const short = v10.slice();
  new DataView(short.buffer).setUint16(10, 1, true);
  new DataView(short.buffer).setUint32(
    20,
    crc32cUpdate(short.subarray(24, 208), crc32c(short.subarray(0, 20))),
    true,
  );
  assert.throws(() => decodeHeader(short), (e: SnapshotError) => e.kind === "format");
});
