// The scheduler's decision for one step, as a pure function of the pending sequences' states and
// the pool's counts: which rows the step carries and how many tokens each, whether it runs as a
// burst of decode steps, which sequences must be preempted first, and whether the oldest work can
// never fit. It reads and changes nothing else; the scheduler's loop carries the plan out
// (lib/serve/scheduler.ts).

/** Where one sequence's request stands in the scheduler. */
export type SeqState =
  /** attached with no work: its request holds it (sampling, streaming, an export) */
  | "idle"
  /** a prompt for an empty sequence, nothing of it stepped yet: it leaves the watermark free */
  | "waiting"
  /** tokens to append partly stepped, or several appended to a sequence that holds KV */
  | "prefilling"
  /** one token appended to a sequence that holds KV */
  | "decoding"
  /** its KV was dropped for an older sequence: it recomputes every token it held, then its own
   *  (it leaves the watermark free, as a new prompt does) */
  | "preempted"
  /** detached */
  | "finished";

/** One sequence with a pending work, as the plan sees it. */
export interface PlanSeq {
  /** admission order (older = smaller) */
  id: number;
  /** waiting, prefilling, decoding or preempted (the states with a pending work) */
  state: SeqState;
  /** tokens of its work not stepped yet */
  left: number;
  /** tokens in its cache */
  length: number;
  /** KV blocks it holds */
  held: number;
  /** tokens a preemption would recompute (those the scheduler knows are in its cache) */
  history: number;
  /** a decode that may take this many tokens past the first in a burst */
  burst?: number;
  /** its work samples in the step (rather than returning logits) */
  samples: boolean;
}

/** The pool and the limits a plan fits in. */
export interface PlanInput {
  /** every sequence with a pending work, oldest first */
  seqs: readonly PlanSeq[];
  /** blocks the steps may take now (free in the pool, less those reserved) */
  free: number;
  blockTokens: number;
  blocksTotal: number;
  /** free blocks a new prompt (or a recompute) must leave for running sequences to grow */
  watermark: number;
  /** most rows in one step */
  maxBatch: number;
  /** most new tokens in one step */
  maxStepTokens: number;
  /** most decode steps a burst may run now (1: no bursts) */
  burstSteps: number;
}

/** One row of the step: `seqs[seq]` appends its next `n` tokens. */
export interface PlanRow {
  seq: number;
  n: number;
}

/** What the loop does next. */
export interface StepPlan {
  /** indexes into PlanInput.seqs to preempt before the step, in order */
  preempt: number[];
  /** the step's rows: decodes (oldest first), then prefill chunks first come first served */
  rows: PlanRow[];
  /** decode steps the rows run back to back (> 1: a burst; every row then a decode) */
  steps: number;
  /** index of the oldest work when it can never fit in the pool (fail it); rows are then empty */
  tooLarge: number | null;
}

// Block accounting: the only place the plan turns tokens into KV blocks and back.

/** Blocks a sequence of `length` tokens holding `held` blocks needs to append `tokens` more. */
export function blocksToAppend(
  length: number,
  held: number,
  tokens: number,
  blockTokens: number,
): number {
  return Math.max(0, Math.ceil((length + tokens) / blockTokens) - held);
}

/** Tokens a sequence of `length` tokens holding `held` blocks can append within `blocks` more. */
export function tokensWithin(
  length: number,
  held: number,
  blocks: number,
  blockTokens: number,
): number {
  return (held + blocks) * blockTokens - length;
}

/** Blocks a preemption of a sequence holding `held` blocks gives back to the pool. */
export function blocksFreedByPreempting(held: number): number {
  return held;
}

/**
 * Plans one step. Decodes first, oldest first: a decode that cannot grow preempts the youngest
 * block-holding sequence younger than itself (not already in the step); when there is none it
 * waits for a later step. Then prefill chunks first come first served within the token budget: a
 * work that cannot get any block stops the scan, so later arrivals never overtake it, and a new
 * prompt (or a recompute) leaves the watermark free. When nothing fits, the youngest holder
 * younger than the oldest work is preempted and the step planned again. A step of nothing but
 * burst-capable decodes, with every pending work in it and blocks for all their tokens, runs as a
 * burst of up to `burstSteps` steps.
 * @param input the pending sequences and the pool (not changed)
 * @returns the plan
 */
export function planStep(input: PlanInput): StepPlan {
  const { seqs, blockTokens: bt } = input;
  // The sequences as the plan sees them: copied at the first preemption, which changes the victim.
  let view: readonly PlanSeq[] = seqs;
  let copy: PlanSeq[] | null = null;
  let poolFree = input.free;
  const preempt: number[] = [];

  /** Preempts the youngest block-holder younger than view[requester] and not in `inPlan`. */
  const preemptFor = (requester: number, inPlan: Set<number>): boolean => {
    let victim = -1;
    for (let i = 0; i < view.length; i++) {
      if (view[i].id <= view[requester].id || inPlan.has(i) || view[i].held === 0) continue;
      if (victim < 0 || view[i].id > view[victim].id) victim = i;
    }
    if (victim < 0) return false;
    const v = view[victim];
    poolFree += blocksFreedByPreempting(v.held);
    copy ??= [...seqs];
    copy[victim] = {
      ...v,
      state: "preempted",
      left: v.left + v.history,
      history: 0,
      length: 0,
      held: 0,
    };
    view = copy;
    preempt.push(victim);
    return true;
  };

  for (;;) {
    const rows: PlanRow[] = [];
    const inPlan = new Set<number>();
    let committed = 0; // blocks the rows take so far
    let budget = input.maxStepTokens;
    const free = () => poolFree - committed;
    // Decodes (and a prompt's last token on a sequence holding KV), oldest first.
    for (let i = 0; i < view.length; i++) {
      if (rows.length >= input.maxBatch || budget < 1) break;
      const s = view[i];
      if (s.left !== 1 || s.length === 0) continue;
      const need = blocksToAppend(s.length, s.held, 1, bt);
      while (need > free() && preemptFor(i, inPlan));
      if (need > free()) continue;
      rows.push({ seq: i, n: 1 });
      inPlan.add(i);
      committed += need;
      budget--;
    }
    // Prefill chunks, first come first served.
    for (let i = 0; i < view.length; i++) {
      if (inPlan.has(i) || rows.length >= input.maxBatch || budget < 1) continue;
      const s = view[i];
      if (s.state === "decoding") continue; // a decode that found no block waits
      const fresh = s.state === "waiting" || s.state === "preempted";
      const avail = Math.max(0, free() - (fresh ? input.watermark : 0));
      const n = Math.min(s.left, budget, tokensWithin(s.length, s.held, avail, bt));
      if (n < 1) break;
      rows.push({ seq: i, n });
      inPlan.add(i);
      committed += blocksToAppend(s.length, s.held, n, bt);
      budget -= n;
    }
    if (rows.length > 0 || seqs.length === 0) {
      return { preempt, rows, steps: burstSteps(input, rows, preempt, poolFree), tooLarge: null };
    }
    // Blocked: free the youngest holder younger than the oldest work, then plan again.
    if (preemptFor(0, new Set())) continue;
    const total = view[0].length + view[0].left;
    const tooLarge = Math.ceil(total / bt) > input.blocksTotal ? 0 : null;
    return { preempt, rows, steps: 1, tooLarge };
  }
}

/** Steps of a burst for these rows: more than one only when bursts are on, every pending work is
 *  a row, each a burst-capable sampled decode of a sequence with history, nothing was preempted,
 *  and the pool holds every row's tokens for the whole burst. */
function burstSteps(
  input: PlanInput,
  rows: readonly PlanRow[],
  preempt: readonly number[],
  poolFree: number,
): number {
  let k = input.burstSteps;
  if (!(k >= 2) || rows.length !== input.seqs.length || preempt.length > 0) return 1;
  for (const { seq, n } of rows) {
    const s = input.seqs[seq];
    if (
      n !== 1 || s.state !== "decoding" || s.burst === undefined || !s.samples || s.history === 0
    ) {
      return 1;
    }
    k = Math.min(k, s.burst + 1);
  }
  if (k < 2) return 1;
  let need = 0;
  for (const { seq } of rows) {
    const s = input.seqs[seq];
    need += blocksToAppend(s.length, s.held, k, input.blockTokens);
  }
  return need <= poolFree ? k : 1;
}
