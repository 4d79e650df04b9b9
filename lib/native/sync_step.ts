// When a single-token step (NativeSequence.decode / decodeSample) runs as a synchronous FFI call
// on the JavaScript thread instead of a nonblocking one. A nonblocking call hands the work to a
// Deno worker thread and wakes the event loop when done: ~45 µs per call on our 2-vCPU machines
// (a nonblocking getpid: 42 µs mean), 66–110 µs between decode steps of tiny-powerful (measured
// natively, docs/native.md "Per-token overhead") — a third of a tiny model's step. A synchronous
// call has none of that but blocks the event loop, so it is taken only for short steps and for
// a bounded time: after `budgetMs` of back-to-back synchronous steps the next step is nonblocking
// and returns to the event loop (I/O is polled there; due timers were seen to wait for the whole
// loop once in a full parallel test run, so a timer is not guaranteed a turn). The batched step's
// synchronous decode steps (lib/native/batch.ts) share the same budget: after budgetMs of them it
// yields one event-loop turn (setImmediate, which does give due timers their turn) — a turn after
// every step cost 40–100 µs of a ~1.2 ms 32-row tiny-fast step (measured 2026-12-03). Not a
// scheduler.

/** The policy; tests may change it (`maxStepMs = 0` / `maxBatchStepMs = 0` make every step
 *  nonblocking). */
export const syncStep = {
  /** a step whose previous run took less than this (ms) runs synchronously */
  maxStepMs: 1,
  /** a decode-only batched step (lib/native/batch.ts) of a model whose previous one took less than
   *  this (ms) runs synchronously: a 32-row step is several single steps long, and the handoff to
   *  a Deno pool thread and back cost ~0.3 ms of a 1.3 ms 32-row tiny-fast step (2026-12-03) */
  maxBatchStepMs: 4,
  /** synchronous batched steps taken in this process (for tests and diagnostics) */
  batchTaken: 0,
  /** longest run of back-to-back synchronous steps (ms) before one nonblocking step */
  budgetMs: 4,
  /** synchronous steps taken in this process (a counter for tests and diagnostics) */
  taken: 0,
};

/** performance.now() when the current run of synchronous steps began; -1 when none. */
let runStart = -1;

/**
 * Whether the next step runs synchronously.
 * @param lastStepMs duration of this sequence's previous step (Infinity when none)
 * @returns true: call the synchronous symbol; false: the nonblocking one
 */
export function chooseSync(lastStepMs: number): boolean {
  if (!(lastStepMs < syncStep.maxStepMs)) return false;
  const now = performance.now();
  if (runStart < 0) runStart = now;
  if (now - runStart >= syncStep.budgetMs) {
    runStart = -1; // this step is nonblocking: the event loop gets its turn
    return false;
  }
  syncStep.taken++;
  return true;
}

/** Records that a nonblocking step completed (the event loop had a turn). */
export function nonblockingDone(): void {
  runStart = -1;
}

/**
 * After a synchronous batched step: whether the event loop is due its turn now (budgetMs of
 * back-to-back synchronous steps have passed; the caller then yields with setImmediate).
 * @returns true once per budget; the next run of synchronous steps starts after it
 */
export function turnDue(): boolean {
  const now = performance.now();
  if (runStart < 0) runStart = now;
  if (now - runStart < syncStep.budgetMs) return false;
  runStart = -1;
  return true;
}
