// When a single-token step (NativeSequence.decode / decodeSample) or a decode-only batched step
// (lib/native/batch.ts) runs as a synchronous FFI call on the JavaScript thread instead of a
// nonblocking one. A nonblocking call hands the work to a Deno worker thread and wakes the event
// loop when done: ~45 µs per call on our 2-vCPU machines (a nonblocking getpid: 42 µs mean),
// 66–110 µs between decode steps of tiny-powerful (measured natively, docs/native.md "Per-token
// overhead") — a third of a tiny model's step. A synchronous call has none of that but blocks the
// event loop, so it is taken only for short steps and for a bounded time: after `budgetMs` of
// back-to-back synchronous steps (one budget for both kinds) the caller yields one event-loop turn
// (eventLoopTurn), which gives due timers and I/O their turn. Making the next step nonblocking
// instead would poll I/O, but a quickly finished op can resolve before due timers run, so a timer
// would not be guaranteed a turn. A turn after every step costs 40–100 µs of a ~1.2 ms 32-row
// tiny-fast step, hence one per budget. Not a scheduler.

import { setImmediate } from "node:timers";
import type { NativeLibrary } from "./library.ts";

/** The policy; tests may change it (`maxStepMs = 0` / `maxBatchStepMs = 0` make every step
 *  nonblocking). */
export const syncStep = {
  /** a step whose previous run took less than this (ms) runs synchronously */
  maxStepMs: 1,
  /** a decode-only batched step (lib/native/batch.ts) of a model whose previous one took less than
   *  this (ms) runs synchronously: a 32-row step is several single steps long, and the handoff to
   *  a Deno pool thread and back costs ~0.3 ms of a 1.3 ms 32-row tiny-fast step */
  maxBatchStepMs: 4,
  /** synchronous batched steps taken in this process (for tests and diagnostics) */
  batchTaken: 0,
  /** longest run of back-to-back synchronous steps (ms) before the event loop gets a turn */
  budgetMs: 4,
  /** synchronous steps taken in this process (a counter for tests and diagnostics) */
  taken: 0,
  /** event-loop turns taken (eventLoopTurn; for tests and diagnostics) */
  turns: 0,
};

/** performance.now() when the current run of synchronous steps began; -1 when none. */
let runStart = -1;

/**
 * Whether the next single-token step runs synchronously (then call {@link turnDue} after it).
 * @param lastStepMs duration of this sequence's previous step (Infinity when none)
 * @returns true: call the synchronous symbol; false: the nonblocking one
 */
export function chooseSync(lastStepMs: number): boolean {
  if (!(lastStepMs < syncStep.maxStepMs)) return false;
  syncStep.taken++;
  return true;
}

/** Records that a nonblocking step completed (the event loop had a turn). */
export function nonblockingDone(): void {
  runStart = -1;
}

/**
 * After a synchronous step: whether the event loop is due its turn now (budgetMs of back-to-back
 * synchronous steps have passed; the caller then awaits {@link eventLoopTurn}).
 * @returns true once per budget; the next run of synchronous steps starts after it
 */
export function turnDue(): boolean {
  const now = performance.now();
  if (runStart < 0) runStart = now;
  if (now - runStart < syncStep.budgetMs) return false;
  runStart = -1;
  return true;
}

/**
 * One event-loop turn: sockets are polled and due timers run before it resolves. Measured
 * with Deno 2.9.6 (a server spinning in 0.4 ms steps with a turn every 4 ms, and the
 * service streaming a 250-token generation while another process asked for /metrics):
 * setImmediate alone runs due timers but never polls sockets — /metrics waited for the whole
 * generation (120–460 ms); a completed nonblocking FFI call makes the event loop poll every op,
 * sockets included, but can resolve before due timers run; a poll, the timers, then a second poll
 * answered /metrics within 8–13 ms, streaming or not (one poll sufficed only without streaming:
 * an accepted request's handler then needs the next poll). setTimeout(0) does both but costs
 * ~2.1 ms per turn (Deno's timer granularity), where these cost ~5–45 µs each.
 * @param lib the library (its nonblocking no-op)
 */
export async function eventLoopTurn(lib: NativeLibrary): Promise<void> {
  syncStep.turns++;
  await lib.symbols.kvr_abi_version_nonblocking();
  await new Promise<void>((resolve) => setImmediate(resolve));
  await lib.symbols.kvr_abi_version_nonblocking();
}
