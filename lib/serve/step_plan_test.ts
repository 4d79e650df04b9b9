// planStep as a pure function: given the pending sequences' states and the pool's counts, the
// expected plan, worked out by hand from the rules in lib/serve/step_plan.ts (4 tokens a block).

import assert from "node:assert/strict";
import { type PlanInput, type PlanSeq, planStep } from "./step_plan.ts";

/** A sequence with nothing in its cache and a prompt of `left` tokens. */
function prompt(id: number, left: number): PlanSeq {
  return { id, state: "waiting", left, length: 0, held: 0, history: 0, samples: false };
}

/** A sequence of `length` tokens (blocks exactly enough) appending one sampled token. */
function decode(id: number, length: number, burst?: number): PlanSeq {
  return {
    id,
    state: "decoding",
    left: 1,
    length,
    held: Math.ceil(length / 4),
    history: length,
    burst,
    samples: true,
  };
}

function input(seqs: PlanSeq[], over: Partial<PlanInput> = {}): PlanInput {
  return {
    seqs,
    free: 100,
    blockTokens: 4,
    blocksTotal: 100,
    watermark: 0,
    maxBatch: 64,
    maxStepTokens: 256,
    burstSteps: 1,
    ...over,
  };
}

Deno.test("planStep puts decodes before prefill chunks, and a chunk takes what the token budget leaves", () => {
  const plan = planStep(input([prompt(0, 100), decode(1, 5), decode(2, 9)], { maxStepTokens: 50 }));
  assert.deepEqual(plan, {
    preempt: [],
    rows: [{ seq: 1, n: 1 }, { seq: 2, n: 1 }, { seq: 0, n: 48 }],
    steps: 1,
    tooLarge: null,
  });
});

Deno.test("planStep: a new prompt and a recompute leave the watermark free; a running prefill does not", () => {
  const running: PlanSeq = {
    id: 1,
    state: "prefilling",
    left: 40,
    length: 4,
    held: 1,
    history: 4,
    samples: false,
  };
  const recompute: PlanSeq = { ...prompt(2, 40), state: "preempted" };
  // 5 free, watermark 2: the new prompt gets 3 blocks (12 tokens) and leaves 2; the running
  // prefill takes those 2 (8 tokens); the recompute then finds nothing above the watermark.
  const plan = planStep(input([prompt(0, 40), running, recompute], { free: 5, watermark: 2 }));
  assert.deepEqual(plan.rows, [{ seq: 0, n: 12 }, { seq: 1, n: 8 }]);
  assert.deepEqual(plan.preempt, []);
  // Alone with the same pool, the recompute is held to the watermark as a new prompt is.
  assert.deepEqual(planStep(input([recompute], { free: 5, watermark: 2 })).rows, [
    { seq: 0, n: 12 },
  ]);
});

Deno.test("planStep preempts the youngest block holder younger than a decode that cannot grow, never an older one", () => {
  const older: PlanSeq = { // holds 3 blocks, waits for more
    id: 0,
    state: "prefilling",
    left: 20,
    length: 12,
    held: 3,
    history: 12,
    samples: false,
  };
  const seqs = [older, decode(1, 8), decode(2, 6), decode(3, 3)];
  // The decode of 1 needs a third block; none is free: 3 (the youngest, 1 block) goes, then 2
  // would be next but one block is enough. 2 decodes in its own block; 3, preempted, recomputes
  // only above the watermark (none here, but no block is left).
  const plan = planStep(input(seqs, { free: 0 }));
  assert.deepEqual(plan, {
    preempt: [3],
    rows: [{ seq: 1, n: 1 }, { seq: 2, n: 1 }],
    steps: 1,
    tooLarge: null,
  });
});

Deno.test("planStep keeps first come first served: a prompt that finds no block stops later ones from overtaking", () => {
  const later: PlanSeq = { // has room left in its own block: it could take 2 tokens for free
    id: 2,
    state: "prefilling",
    left: 5,
    length: 2,
    held: 1,
    history: 2,
    samples: false,
  };
  // One free block, the watermark: the new prompt gets nothing; the later prefill waits.
  const plan = planStep(input([decode(0, 3), prompt(1, 8), later], { free: 1, watermark: 1 }));
  assert.deepEqual(plan, { preempt: [], rows: [{ seq: 0, n: 1 }], steps: 1, tooLarge: null });
});

Deno.test("planStep: when nothing fits it preempts for the oldest work, and fails a work no pool could hold", () => {
  const head: PlanSeq = { ...prompt(0, 8), held: 0 };
  const holder: PlanSeq = {
    id: 1,
    state: "prefilling",
    left: 5,
    length: 2,
    held: 1,
    history: 2,
    samples: false,
  };
  assert.deepEqual(planStep(input([head, holder], { free: 1, watermark: 1 })), {
    preempt: [1],
    rows: [{ seq: 0, n: 4 }],
    steps: 1,
    tooLarge: null,
  });
  const huge: PlanSeq = { ...holder, id: 0, length: 12, held: 3, left: 8 };
  assert.deepEqual(planStep(input([huge], { free: 0, blocksTotal: 4 })), {
    preempt: [],
    rows: [],
    steps: 1,
    tooLarge: 0,
  });
});

Deno.test("planStep runs a burst only when every pending work is a burst decode with blocks for all its steps", () => {
  const burst = { burstSteps: 8 };
  assert.equal(planStep(input([decode(0, 5, 7), decode(1, 9, 3)], burst)).steps, 4);
  assert.equal(
    planStep(input([decode(0, 5, 7), decode(1, 9)], burst)).steps,
    1,
    "one row asks one",
  );
  assert.equal(planStep(input([decode(0, 5, 7), prompt(1, 3)], burst)).steps, 1, "a prompt waits");
  assert.equal(planStep(input([decode(0, 5, 7)], { burstSteps: 1 })).steps, 1, "bursts off");
  // A prompt held back by the watermark is no row, yet it waits: no burst delays its next plan.
  const held = { ...burst, free: 2, watermark: 2 };
  assert.deepEqual(planStep(input([decode(0, 5, 7)], held)).steps, 8);
  assert.deepEqual(planStep(input([decode(0, 5, 7), prompt(1, 3)], held)), {
    preempt: [],
    rows: [{ seq: 0, n: 1 }],
    steps: 1,
    tooLarge: null,
  });
  // 8 steps from 5 tokens need 2 more blocks; 1 free: a single step.
  assert.equal(planStep(input([decode(0, 5, 7)], { ...burst, free: 1 })).steps, 1);
});

Deno.test("planStep changes nothing it is given", () => {
  const seqs = [decode(0, 8), prompt(1, 30), decode(2, 4)];
  const given = input(seqs, { free: 0, watermark: 0 });
  const copy = structuredClone(given);
  const plan = planStep(given);
  assert.deepEqual(plan.preempt, [2], "the prompt holds no block: the decode of 2 is preempted");
  assert.deepEqual(given, copy);
  assert.deepEqual(planStep(given), plan, "the same input plans the same step");
});
