// Admission: the one place a request acquires engine capacity on a tier (its bounded queue)
// under the tier's request deadline, and the errors a request gets when that deadline, its
// client or a shutdown stops it. A scheduler that batches requests replaces the queue behind
// admitSlot; callers keep the same Slot.
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

/** A held queue slot with the request's deadline; `release` frees the slot and the timer. */
export interface Slot {
  /** Fires on timeout, shutdown or client abort. */
  signal: AbortSignal;
  /** Fires on timeout only. */
  timeout: AbortSignal;
  /** Releases the slot and clears the deadline timer (idempotent). */
  release: () => void;
}

/**
 * Waits for a generation slot on `tier` under the tier's request deadline, which counts from the
 * request's arrival (time spent receiving its body included).
 * @param rt the runtime
 * @param tier the tier
 * @param ctx the request (client signal, arrival)
 * @returns the slot
 * @throws {QueueFullError} when the queue is full; {@link UnavailableError} on timeout,
 *   shutdown, or a client gone while queued
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
    const release = await tier.queue.acquire(signal);
    let done = false;
    return {
      signal,
      timeout: tc.signal,
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
