// The cross-backend golden snapshots (tests/fixtures/golden): today's CPU backend reproduces each
// file byte for byte (native chunk encoder and the reference TypeScript encoder alike) and imports it —
// lossless files restore the exact values, q8/q4 files decode within the documented bounds and
// exactly as the TypeScript decoder does. The GPU check compares device output with these files.

import assert from "node:assert/strict";
import { loadModel } from "../lib/engine/mod.ts";
import {
  decodeSnapshot,
  defaultKvCodec,
  encodeSnapshot,
  geometryOf,
  importSnapshot,
} from "../lib/snapshot/mod.ts";
import { readKvSource, writeKvSink } from "./reference/chunk.ts";
import {
  exportGolden,
  GOLDEN_CASES,
  GOLDEN_CHUNK_TOKENS,
  GOLDEN_MODEL,
  GOLDEN_TOKENS,
  goldenSequence,
  goldenTokenIds,
} from "./fixtures/golden/golden.ts";

const DIR = new URL("./fixtures/golden/", import.meta.url).pathname;
const MODELS = new URL("../models/", import.meta.url).pathname;

function f32(b: Uint8Array): Float32Array {
  return new Float32Array(b.slice().buffer);
}

Deno.test("golden snapshots: the CPU backend reproduces every file byte for byte and imports it", async () => {
  const manifest = JSON.parse(await Deno.readTextFile(`${DIR}manifest.json`));
  assert.deepEqual(manifest.cases, GOLDEN_CASES, "manifest.json lists the cases of golden.ts");
  assert.deepEqual(manifest.tokenIds, goldenTokenIds());
  for (const cacheDtype of ["f32", "bf16"] as const) {
    const model = await loadModel(`${MODELS}${GOLDEN_MODEL}`, { kvDtype: cacheDtype, threads: 1 });
    const L = model.native.config.numLayers;
    const seq = goldenSequence(model);
    try {
      for (const c of GOLDEN_CASES.filter((c) => c.cacheDtype === cacheDtype)) {
        const want = await Deno.readFile(`${DIR}${c.file}`);
        const native = await exportGolden(model, seq, c);
        assert(native.length === want.length && native.every((b, i) => b === want[i]), c.file);
        const ids = goldenTokenIds();
        const ts = await encodeSnapshot(readKvSource(seq), {
          modelFingerprint: model.fingerprint,
          tokenizerFingerprint: model.tokenizer.fingerprint,
          geometry: geometryOf(model.native.config),
          cacheDtype,
          tokenIds: ids.slice(0, GOLDEN_TOKENS),
          pendingTokenIds: ids.slice(GOLDEN_TOKENS),
        }, {
          encoding: c.encoding,
          chunkTokens: GOLDEN_CHUNK_TOKENS,
          groupSize: c.groupSize || undefined,
        });
        assert(ts.every((b, i) => b === want[i]), `${c.file} (TypeScript encoder)`);

        const imp = await importSnapshot(model, want, { reserve: 0, prefillPending: false });
        const oracle = model.native.createSequence(GOLDEN_TOKENS);
        await decodeSnapshot(want, { onHeader: () => writeKvSink(oracle) }, {
          codec: defaultKvCodec(),
        });
        try {
          assert.equal(imp.sequence.length, GOLDEN_TOKENS);
          assert.deepEqual(imp.tokenIds, ids);
          for (let l = 0; l < L; l++) {
            const got = imp.sequence.readKv(l, 0, GOLDEN_TOKENS, "f32");
            assert.deepEqual(
              got,
              oracle.readKv(l, 0, GOLDEN_TOKENS, "f32"),
              `${c.file} layer ${l}`,
            );
            const src = seq.readKv(l, 0, GOLDEN_TOKENS, "f32");
            if (c.encoding === cacheDtype) {
              assert.deepEqual(got, src, `${c.file} layer ${l} restores the cache exactly`);
              continue;
            }
            // lossy for this cache: within half a quantization step of the block's range
            for (const part of ["k", "v"] as const) {
              const x = f32(src[part]), y = f32(got[part]);
              let range = 0;
              for (const a of x) range = Math.max(range, Math.abs(a));
              const tol = c.encoding === "q8"
                ? range / 127
                : c.encoding === "q4"
                ? range / 15
                : range * 2 ** -8;
              for (let i = 0; i < x.length; i++) {
                assert(Math.abs(x[i] - y[i]) <= tol, `${c.file} layer ${l} ${part}[${i}]`);
              }
            }
          }
        } finally {
          imp.sequence.free();
          oracle.free();
        }
      }
    } finally {
      seq.free();
      model.native.free();
    }
  }
});
