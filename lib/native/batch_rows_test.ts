// Tests that a row's result in a batched step does not depend on which rows share the step: the
// step's GEMMs split many rows into row blocks, and a block of too few rows would take another
// kernel (a 1-row block: the GEMV) than the tiles the row takes in any other step.

import assert from "node:assert/strict";
import { NativeModel } from "./mod.ts";
import { checkpoint, DEMO_DIRS, relDiff, tokens } from "./test_helpers.ts";

Deno.test("batchStep() gives a decode the same bits whichever prefill chunk shares its step (48–80 rows)", async () => {
  // The decode is the step's last row: under the old 6-row rounding a 55- or 73-row step left it
  // a block of its own (a GEMV: other bits than the AMX tiles; under the avx512 or avx2 kernel
  // caps the old library happened to give that row the same bits).
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[2]), { threads: 2 });
  const vocab = model.config.vocabSize;
  const pool = model.createKvPool(512, 16);
  try {
    using dec = pool.createSequence(64);
    await model.batchStep([{ seq: dec, tokens: tokens(20, vocab, 7), wantLogits: false }]);
    let first: Float32Array | null = null;
    for (let rows = 48; rows <= 80; rows++) {
      using chunk = pool.createSequence(rows);
      const out = await model.batchStep([
        { seq: chunk, tokens: tokens(rows - 1, vocab, rows), wantLogits: false },
        { seq: dec, tokens: [5], wantLogits: true },
      ]);
      const got = out[1];
      assert.ok(got instanceof Float32Array);
      dec.truncate(20);
      first ??= got.slice();
      assert.ok(
        got.every((x, i) => Object.is(x, first![i])),
        `${rows} rows: the decode's logits differ by ${relDiff(got, first)}`,
      );
    }
  } finally {
    pool.free();
  }
});
