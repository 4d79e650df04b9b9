// Tests of the header codec against the worked example in docs/snapshot-format.md (a hand-checked
// known answer) and of decodeHeader's field parsing.

import assert from "node:assert/strict";
import { decodeHeader } from "./format.ts";
import { encodeSnapshot } from "./stream.ts";

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

const exampleSource = {
  readKv(_l: number, s: number, c: number) {
    const k = new Float32Array([1, 2, 3, 4]).slice(s * 2, (s + c) * 2);
    const v = new Float32Array([0.5, -0.5, 0.25, -0.25]).slice(s * 2, (s + c) * 2);
    return { k: new Uint8Array(k.buffer), v: new Uint8Array(v.buffer) };
  },
};

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
