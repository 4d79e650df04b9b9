// Deadlines and the memory bound of request and response bodies. A request body must arrive
// completely within its body deadline — server.body_timeout_ms of the request's arrival, and no
// later than the tier's request_timeout_ms (the request could not be served past it anyway) — and
// every byte of it is charged to the process's body budget as it arrives. Every body read (JSON or
// snapshot, every route) goes through bodyWithin, so a stalled or trickling upload is answered
// (408, or 429 when the budget is full) instead of holding a connection and unbounded memory.
// A response body must be taken by its client within the request deadline (writeWithin): one the
// client does not read is aborted then, and cancelling it frees what produces it (a tier slot, a
// sequence, queued SSE frames).
import type { TierConfig } from "../config/mod.ts";
import { InputError, UnavailableError } from "./errors.ts";
import { untilAborted } from "./handoff.ts";
import type { RequestContext } from "./request.ts";
import type { Runtime } from "./runtime.ts";
import type { BodyHold } from "./uploads.ts";

/** A body stream guarded by its deadline and charged to the body budget. */
export interface GuardedBody {
  stream: ReadableStream<Uint8Array>;
  /** Bytes charged so far (returned to the budget by `release`). */
  hold: BodyHold;
  /** Call when finished reading: clears the deadline timer. */
  done(): void;
  /** Returns the body's bytes to the budget; call when the request no longer keeps them. */
  release(): void;
}

/** The tier a request body is for, when the route knows it before reading the body. */
export interface BodyTier {
  name: string;
  config: Pick<TierConfig, "request_timeout_ms">;
}

/**
 * The body deadline of a request: server.body_timeout_ms, capped by the tier's
 * request_timeout_ms — or, when the tier is not known before the body is read (JSON bodies
 * name it inside), by the longest request_timeout_ms of any tier.
 * @param rt the runtime (config)
 * @param tier the request's tier, when known
 * @returns the deadline in ms from arrival and the setting it comes from (for the 408's message)
 */
export function bodyDeadline(rt: Runtime, tier?: BodyTier): { ms: number; from: string } {
  const body = rt.config.server.body_timeout_ms;
  if (tier) {
    const t = tier.config.request_timeout_ms;
    return t < body
      ? { ms: t, from: `tier "${tier.name}"'s request_timeout_ms` }
      : { ms: body, from: "server.body_timeout_ms" };
  }
  const longest = Math.max(...Object.values(rt.config.tiers).map((t) => t.request_timeout_ms));
  return longest < body
    ? { ms: longest, from: "the longest request_timeout_ms of any tier" }
    : { ms: body, from: "server.body_timeout_ms" };
}

/** Charges every chunk to `hold` as it is read; over the budget the stream errors (BusyError)
 *  and the source is cancelled, so the rest of the body is never read. */
function charged(stream: ReadableStream<Uint8Array>, hold: BodyHold): ReadableStream<Uint8Array> {
  const reader = stream.getReader();
  return new ReadableStream<Uint8Array>({
    async pull(ctl) {
      const r = await reader.read();
      if (r.done) return ctl.close();
      try {
        hold.add(r.value.length);
      } catch (e) {
        ctl.error(e);
        await reader.cancel(e).catch(() => {});
        return;
      }
      ctl.enqueue(r.value);
    },
    cancel(why) {
      return reader.cancel(why);
    },
  }, { highWaterMark: 0 });
}

/**
 * Guards a request body by its deadline, shutdown and the client's signal (a pending read fails
 * at once when one fires, and the body is cancelled), and charges its bytes to the process's
 * body budget as they arrive (429 when the budget is full).
 * @param rt the runtime (limits, body budget, shutdown signal)
 * @param body the raw body
 * @param ctx the request (arrival, client)
 * @param tier the request's tier, when known before the body is read (caps the deadline)
 * @returns the guarded stream, its hold and its cleanups
 */
export function bodyWithin(
  rt: Runtime,
  body: ReadableStream<Uint8Array>,
  ctx: Omit<RequestContext, "tenant">,
  tier?: BodyTier,
): GuardedBody {
  const { ms, from } = bodyDeadline(rt, tier);
  const left = ctx.arrivalMs === undefined ? ms : ms - (performance.now() - ctx.arrivalMs);
  const timeout = new AbortController();
  const timer = setTimeout(() => timeout.abort(), Math.max(0, left));
  const parts = [timeout.signal, rt.shutdownSignal];
  if (ctx.client) parts.push(ctx.client);
  const hold = rt.uploads.hold();
  const stream = untilAborted(charged(body, hold), AbortSignal.any(parts), () => {
    if (rt.shutdownSignal.aborted) {
      return new UnavailableError("shutting_down", "server is shutting down");
    }
    if (ctx.client?.aborted) return new UnavailableError("client_gone", "client disconnected");
    return new InputError(
      `request body not received within ${ms} ms (${from})`,
      "body",
      "body_timeout",
    );
  });
  return { stream, hold, done: () => clearTimeout(timer), release: () => hold.release() };
}

/** After its deadline, how long a response body may still wait on its client in all (the client
 *  was reading at the deadline, e.g. an SSE stream whose producer ends with a timeout frame). */
export const WRITE_GRACE_MS = 1000;

/**
 * Bounds how long a response body waits on its client. The consumer pulls one chunk at a time
 * (nothing is read ahead of it); when `deadline` fires while the consumer is not asking for a
 * chunk — the client stopped reading and the server's write buffers are full — the body is
 * aborted at once: the consumer's stream errors (the connection is cut) and the source is
 * cancelled, which frees whatever produces it. A consumer that is waiting on the source at the
 * deadline (the producer is late, not the client) gets {@link WRITE_GRACE_MS} more of its own
 * time in all.
 * @param source the response body
 * @param deadline fires at the request deadline
 * @param hooks `onExpire`: once when the deadline aborts the body (metrics); `onFinish`: once when
 *   the body is done, however it ends
 * @returns the guarded body
 */
export function writeWithin(
  source: ReadableStream<Uint8Array>,
  deadline: AbortSignal,
  hooks: { onExpire?: () => void; onFinish?: () => void } = {},
): ReadableStream<Uint8Array> {
  const reader = source.getReader();
  let ctl!: ReadableStreamDefaultController<Uint8Array>;
  let finished = false;
  let waiting = false; // the consumer asked for a chunk and the source has not given it yet
  let overtime = false; // the deadline has passed while the consumer was waiting
  let spent = 0; // the consumer's own time used since the deadline
  let since = 0; // when the consumer last got a chunk (while in overtime)
  let timer: ReturnType<typeof setTimeout> | undefined;
  const finish = () => {
    if (finished) return;
    finished = true;
    clearTimeout(timer);
    deadline.removeEventListener("abort", onDeadline);
    hooks.onFinish?.();
  };
  const expire = () => {
    if (finished) return;
    finish();
    hooks.onExpire?.();
    const why = new Error("response not taken by the client within the request deadline");
    // Deno.serve logs the error that ends a response body: one line, its stack says nothing.
    why.stack = `${why.name}: ${why.message}`;
    try {
      ctl.error(why);
    } catch {
      // already closed: nothing waits on it
    }
    reader.cancel(why).catch(() => {});
  };
  // In overtime, the consumer's time runs while it is not asking for a chunk.
  const consumerTurn = () => {
    since = performance.now();
    timer = setTimeout(expire, Math.max(0, WRITE_GRACE_MS - spent));
  };
  const onDeadline = () => {
    if (finished) return;
    if (!waiting) return expire();
    overtime = true;
  };
  return new ReadableStream<Uint8Array>({
    start(c) {
      ctl = c;
      if (deadline.aborted) onDeadline();
      else deadline.addEventListener("abort", onDeadline, { once: true });
    },
    async pull(c) {
      if (finished) return;
      if (overtime && timer !== undefined) {
        clearTimeout(timer);
        timer = undefined;
        spent += performance.now() - since;
      }
      waiting = true;
      let r: ReadableStreamReadResult<Uint8Array>;
      try {
        r = await reader.read();
      } catch (e) {
        waiting = false;
        if (finished) return;
        finish();
        c.error(e);
        return;
      }
      waiting = false;
      if (finished) return;
      if (r.done) {
        finish();
        c.close();
        return;
      }
      c.enqueue(r.value);
      if (overtime) consumerTurn();
    },
    cancel(why) {
      finish();
      return reader.cancel(why);
    },
  }, { highWaterMark: 0 });
}

/**
 * An AbortSignal that fires `ms` after the request's arrival (at once when that has passed).
 * @param arrivalMs performance.now() at arrival (undefined: now)
 * @param ms the deadline, in ms from arrival
 * @returns the signal and a function clearing its timer
 */
export function deadlineSignal(
  arrivalMs: number | undefined,
  ms: number,
): { signal: AbortSignal; clear(): void } {
  const left = arrivalMs === undefined ? ms : ms - (performance.now() - arrivalMs);
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), Math.max(0, left));
  return { signal: ac.signal, clear: () => clearTimeout(timer) };
}
