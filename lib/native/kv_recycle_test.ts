// End-to-end check of the CPU backend's KV buffer recycling (native/src/core/kv_recycle.h) through
// the library: a sequence created after others were freed — on one of their buffers — reads
// zeros wherever nothing was written (what a fresh calloc gives; the oracle), and computes the
// same logits as a sequence on a never-used buffer. The recycler's budget and eviction rule are
// covered by the g++ test (native/tests/kv_recycle_test.ts).

import assert from "node:assert/strict";
import { NativeModel } from "./model.ts";
import type { KvDtype } from "./dtype.ts";
import { checkpoint, DEMO_DIRS, tokens } from "./test_helpers.ts";

const CAPACITY = 320; // tiny-fast f32: 655 KB, above the recycler's 256 KiB mapping cut

function firstNonzero(b: Uint8Array): number {
  return b.findIndex((x) => x !== 0);
}

for (const dir of DEMO_DIRS) {
  for (const kvDtype of ["f32", "bf16"] as KvDtype[]) {
    const name = dir.split("/").pop();
    Deno.test(`a sequence on a freed sequence's KV buffer reads zeros where unwritten and computes fresh logits, ${name} ${kvDtype}`, async () => {
      using m = await NativeModel.load(await checkpoint(dir), { kvDtype });
      const c = m.config;
      const toks = tokens(150, c.vocabSize, 7);
      let ref: Float32Array;
      {
        using first = m.createSequence(CAPACITY); // the model's first cache: a fresh allocation
        ref = await first.prefill(toks);
      }
      // Sequences that write everywhere (prefill, then writeKv past the length), then are freed.
      const junk = new Uint8Array(
        c.numKvHeads * (CAPACITY - 150) * c.headDim * (kvDtype === "f32" ? 4 : 2),
      )
        .fill(0x3c);
      for (let i = 0; i < 3; i++) {
        using s = m.createSequence(CAPACITY - 40 * i);
        await s.prefill(tokens(150, c.vocabSize, 100 + i));
        for (let l = 0; l < c.numLayers; l++) {
          const n = CAPACITY - 40 * i - 150;
          s.writeKv(
            l,
            150,
            n,
            junk.subarray(0, junk.length / (CAPACITY - 150) * n),
            junk.subarray(0, junk.length / (CAPACITY - 150) * n),
          );
        }
        s.setLength(CAPACITY - 40 * i);
        assert.notEqual(firstNonzero(s.readKv(0, 0, 1).k), -1, "precondition: the cache holds KV");
        if (i > 0) s.truncate(10); // truncation keeps what was written: still cleared on release
      }
      // New sequences of every size just freed (and one smaller: a buffer up to 2x may be reused).
      for (const cap of [CAPACITY, CAPACITY - 40, CAPACITY - 80, CAPACITY / 2 + 1]) {
        using s = m.createSequence(cap);
        s.setLength(cap); // nothing written: positions read what a fresh cache holds
        for (let l = 0; l < c.numLayers; l++) {
          const { k, v } = s.readKv(l, 0, cap);
          assert.equal(firstNonzero(k), -1, `capacity ${cap} layer ${l}: K not zero`);
          assert.equal(firstNonzero(v), -1, `capacity ${cap} layer ${l}: V not zero`);
        }
        s.setLength(0);
        if (cap >= toks.length) {
          assert.deepEqual(await s.prefill(toks), ref, `capacity ${cap}: logits`);
        }
      }
    });
  }
}
