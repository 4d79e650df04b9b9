// Tests of snapshot export/import on real demo models: greedy continuation after import equals
// generation without export (token for token), bit-exact KV after import for f32/bf16 caches,
// streaming import, signatures, and foreign snapshots refused before any KV is allocated.

import assert from "node:assert/strict";
import { continueFrom, generate, type LoadedModel, loadModel } from "../engine/mod.ts";
import { crc32c, crc32cUpdate } from "./crc32c.ts";
import { SnapshotError } from "./errors.ts";
import { PREFIX_BYTES } from "./format.ts";
import { exportSnapshot, exportSnapshotStream, importSnapshot, snapshotPrompt } from "./engine.ts";

const MODELS = new URL("../../models/", import.meta.url).pathname;
import { VALID_SAMPLE_PATH as CORPUS } from "../../tests/support/corpus.ts";

async function promptIds(model: LoadedModel, n: number, at = 1000): Promise<number[]> {
  const text = (await Deno.readTextFile(CORPUS)).slice(at, at + 8 * n);
  const ids = model.tokenizer.encode(text);
  assert(ids.length >= n, "corpus slice too short");
  return ids.slice(0, n);
}

Deno.test("`importSnapshot()` + continueFrom equals generate token for token (greedy), f32 and bf16 caches", async () => {
  for (const kvDtype of ["f32", "bf16"] as const) {
    const source = await loadModel(`${MODELS}tiny-fast`, { kvDtype, threads: 1 });
    const target = await loadModel(`${MODELS}tiny-fast`, { kvDtype, threads: 1 });
    try {
      for (const n of [1, 2, 100, 300]) {
        const ids = await promptIds(source, n, 500 + n);
        const want = await generate(source, ids, {
          maxTokens: 24,
          stopTokenIds: [],
          temperature: 0,
        });
        const bytes = await snapshotPrompt(source, ids, { chunkTokens: 64 });
        const imp = await importSnapshot(target, bytes, { reserve: 24 });
        try {
          assert.deepEqual(imp.tokenIds, ids);
          assert.equal(imp.sequence.length, n);
          const got = await continueFrom(target, imp.sequence, imp.logits!, {
            maxTokens: 24,
            stopTokenIds: [],
            temperature: 0,
            contextIds: ids,
          });
          assert.deepEqual(got.tokenIds, want.tokenIds, `${kvDtype} prompt ${n}`);
          assert.equal(got.text, want.text);
        } finally {
          imp.sequence.free();
        }
      }
    } finally {
      source.native.free();
      target.native.free();
    }
  }
});

Deno.test("`exportSnapshot()` then `importSnapshot()` restores the KV bit-exactly (default encoding)", async () => {
  for (const kvDtype of ["f32", "bf16", "f16"] as const) {
    const model = await loadModel(`${MODELS}tiny-balanced`, { kvDtype, threads: 1 });
    try {
      const ids = await promptIds(model, 150);
      const seq = model.native.createSequence(150);
      await seq.prefill(ids);
      const bytes = await exportSnapshot(model, seq, { tokens: ids, chunkTokens: 64 });
      const imp = await importSnapshot(model, bytes, { reserve: 0 });
      for (let l = 0; l < model.native.config.numLayers; l++) {
        const a = seq.readKv(l, 0, 150), b = imp.sequence.readKv(l, 0, 150);
        assert.deepEqual(b.k, a.k, `${kvDtype} layer ${l} K`);
        assert.deepEqual(b.v, a.v, `${kvDtype} layer ${l} V`);
      }
      assert.equal(imp.logits, null);
      seq.free();
      imp.sequence.free();
    } finally {
      model.native.free();
    }
  }
});

Deno.test("`importSnapshot()` reads a signed snapshot straight from exportSnapshotStream", async () => {
  const model = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  try {
    const ids = await promptIds(model, 200);
    const seq = model.native.createSequence(200);
    await seq.prefill(ids);
    const key = crypto.getRandomValues(new Uint8Array(32));
    for (const encoding of ["q8", "q4", "bf16"] as const) {
      const stream = exportSnapshotStream(model, seq, {
        tokens: ids,
        encoding,
        chunkTokens: 64,
        sign: { keyId: "fn-a", key },
      });
      const imp = await importSnapshot(model, stream, { verify: { keys: { "fn-a": key } } });
      assert.equal(imp.header.encoding, encoding);
      assert.equal(imp.sequence.length, 200);
      imp.sequence.free();
    }
    const plain = await exportSnapshot(model, seq, { tokens: ids });
    await assert.rejects(
      importSnapshot(model, plain, { verify: { keys: { "fn-a": key } } }),
      (e) => e instanceof SnapshotError && e.kind === "signature",
    );
    seq.free();
  } finally {
    model.native.free();
  }
});

Deno.test("`importSnapshot()` refuses a foreign model's snapshot with a fingerprint error before allocating", async () => {
  const fast = await loadModel(`${MODELS}tiny-fast`, { threads: 1 });
  const powerful = await loadModel(`${MODELS}tiny-powerful`, { threads: 1 });
  try {
    const ids = await promptIds(fast, 40);
    const bytes = await snapshotPrompt(fast, ids);
    await assert.rejects(
      importSnapshot(powerful, bytes),
      (e) =>
        e instanceof SnapshotError && e.kind === "fingerprint" &&
        /not tiny-powerful/.test(e.message),
    );
    // same model fingerprint bytes but a tampered tokenizer fingerprint (CRC recomputed)
    const t = bytes.slice();
    t[PREFIX_BYTES + 40] ^= 0xff;
    const dv = new DataView(t.buffer);
    const hl = dv.getUint32(16, true);
    dv.setUint32(
      20,
      crc32cUpdate(t.subarray(PREFIX_BYTES, PREFIX_BYTES + hl), crc32c(t.subarray(0, 20))),
      true,
    );
    await assert.rejects(
      importSnapshot(fast, t),
      (e) => e instanceof SnapshotError && e.kind === "fingerprint" && /tokenizer/.test(e.message),
    );
    // a huge reserve is refused as bounds, not allocated
    await assert.rejects(
      importSnapshot(fast, bytes, { reserve: 10_000_000 }),
      (e) => e instanceof SnapshotError && e.kind === "bounds",
    );
  } finally {
    fast.native.free();
    powerful.native.free();
  }
});
