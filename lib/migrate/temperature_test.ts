// Temperature helpers against known answers: log-softmax/KL on hand-computed rows, and
// fitTemperature() recovering the temperature that generated synthetic labels.

import assert from "node:assert/strict";
import { mulberry32 } from "../../tests/fixtures/random_checkpoint.ts";
import { applyTemperature, fitTemperature, klDivergence, logSoftmaxRow } from "./temperature.ts";

Deno.test("logSoftmaxRow() and klDivergence() match hand-computed values", () => {
  const lp = logSoftmaxRow(new Float32Array([0, Math.log(3)]), 0, 2);
  assert.ok(Math.abs(lp[0] - Math.log(0.25)) < 1e-7 && Math.abs(lp[1] - Math.log(0.75)) < 1e-7);
  const lq = logSoftmaxRow(new Float32Array([9, 0, 0]), 0, 2, 1); // row 0 of vocab 2: [9, 0]
  const q0 = 1 / (1 + Math.exp(-9));
  const want = 0.25 * Math.log(0.25 / q0) + 0.75 * Math.log(0.75 / (1 - q0));
  assert.ok(Math.abs(klDivergence(lp, lq) - want) < 1e-6);
  assert.equal(klDivergence(lp, lp), 0);
  assert.deepEqual([...applyTemperature(new Float32Array([2, 4]), 2)], [1, 2]);
  assert.throws(() => applyTemperature(new Float32Array(1), 0), RangeError);
});

Deno.test("fitTemperature() recovers the temperature that generated the labels", () => {
  const rand = mulberry32(1);
  const vocab = 16, rows = 3000, T0 = 1.7;
  const logits = new Float32Array(rows * vocab);
  const targets: number[] = [];
  for (let r = 0; r < rows; r++) {
    for (let j = 0; j < vocab; j++) logits[r * vocab + j] = 10 * (rand() - 0.5);
    const p = logSoftmaxRow(logits, r, vocab, T0).map(Math.exp);
    let u = rand(), y = 0;
    while (y < vocab - 1 && (u -= p[y]) > 0) y++;
    targets.push(y);
  }
  const fit = fitTemperature([{ logits, vocab, targets }]);
  console.log(
    `  planted T ${T0}, fitted ${fit.temperature.toFixed(3)}; NLL ${fit.nllBefore.toFixed(4)} → ${
      fit.nllAfter.toFixed(4)
    }`,
  );
  assert.ok(Math.abs(fit.temperature - T0) < 0.15);
  assert.ok(fit.nllAfter < fit.nllBefore);
});
