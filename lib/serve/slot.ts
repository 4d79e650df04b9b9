// Admission: the one place a request is let onto a tier, under the tier's request deadline, and
// the errors a request gets when that deadline, its client or a shutdown stops it. A tier that
// batches admits by KV blocks (its scheduler's plan and reservations): the slot is a ticket of its
// WaitGate, waiting until the request starts, so `queue_depth` bounds the line. A tier without
// batching keeps a bounded queue of `concurrency` slots (ModelQueue).
import { UnavailableError } from "./errors.ts";
import { QueueFullError } from "./queue.ts";
import type { RequestContext } from "./request.ts";
import type { Runtime } from "./runtime.ts";
import type { Tier } from "./tier.ts";

/** Why a generation ended early. */
export type AbortCause = "client" | "timeout" | "shutdown";

/**
 * Why a slot's signal fired.
 * @param client the client's signal
 * @param rt the runtime
 * @returns the cause
 */
export function signalCause(client: AbortSignal | undefined, rt: Runtime): AbortCause {
  if (client?.aborted) return "client";
  if (rt.shutdownSignal.aborted) return "shutdown";
  return "timeout";
}

/**
 * The error for a request whose slot signal fired: its deadline passed, its client went away, or
 * the server is shutting down.
 * @param rt the runtime
 * @param tier the tier
 * @param client the client's signal
 * @param doing what the request was waiting on, e.g. `waiting for tier "fast"`
 * @returns the error to throw
 */
export function stoppedError(
  rt: Runtime,
  tier: Tier,
  client: AbortSignal | undefined,
  doing: string,
): UnavailableError {
  const cause = signalCause(client, rt);
  return new UnavailableError(
    cause === "timeout" ? "timeout" : cause === "client" ? "client_gone" : "shutting_down",
    cause === "timeout"
      ? `timed out after ${tier.config.request_timeout_ms} ms ${doing}`
      : cause === "client"
      ? `client disconnected while ${doing}`
      : "server is shutting down",
  );
}

/** An admitted request with its deadline; `release` frees its place and the timer. */
export interface Slot {
  /** Fires on timeout, shutdown or client abort. */
  signal: AbortSignal;
  /** Fires on timeout only. */
  timeout: AbortSignal;
  /** The request got capacity (its first row planned, its blocks granted): on a batching tier
   *  it stops counting as waiting. Idempotent; a no-op without batching. */
  started: () => void;
  /** Releases the slot (or ticket) and clears the deadline timer (idempotent). */
  release: () => void;
}

/**
 * Admits a request on `tier` under the tier's request deadline, which counts from the request's
 * arrival (time spent receiving its body included): a ticket of the tier's WaitGate when it
 * batches (the request then waits for KV blocks in the scheduler, under the slot's signal), else
 * a slot of its queue, waited for.
 * @param rt the runtime
 * @param tier the tier
 * @param ctx the request (client signal, arrival)
 * @returns the slot
 * @throws {QueueFullError} when `queue_depth` requests already wait; {@link UnavailableError}
 *   on timeout, shutdown, or a client gone while queued
 */
export async function admitSlot(rt: Runtime, tier: Tier, ctx: RequestContext): Promise<Slot> {
  const client = ctx.client;
  const tc = new AbortController();
  const ms = tier.config.request_timeout_ms;
  const left = ctx.arrivalMs === undefined ? ms : ms - (performance.now() - ctx.arrivalMs);
  if (left <= 0) tc.abort(new Error(`timeout after ${ms} ms`));
  const timer = setTimeout(() => tc.abort(new Error(`timeout after ${ms} ms`)), Math.max(0, left));
  const parts = [tc.signal, rt.shutdownSignal];
  if (client) parts.push(client);
  const signal = AbortSignal.any(parts);
  try {
    let started = () => {};
    let release: () => void;
    if (tier.batch) {
      if (signal.aborted) throw signal.reason;
      const ticket = tier.batch.gate.admit();
      started = ticket.start;
      release = ticket.release;
    } else release = await tier.queue!.acquire(signal);
    let done = false;
    return {
      signal,
      timeout: tc.signal,
      started,
      release: () => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        release();
      },
    };
  } catch (e) {
    clearTimeout(timer);
    if (e instanceof QueueFullError) {
      rt.metrics.rejected.inc({ tier: tier.name });
      throw e;
    }
    throw stoppedError(rt, tier, client, `waiting for tier "${tier.name}"`);
  }
}
