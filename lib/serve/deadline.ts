// The deadline of a request body: it must arrive completely within server.body_timeout_ms of
// the request's arrival. Every body read (JSON or snapshot, every route) goes through bodyWithin,
// so a stalled or trickling upload is answered (408) instead of holding a connection and memory.
import { InputError, UnavailableError } from "./errors.ts";
import { untilAborted } from "./handoff.ts";
import type { RequestContext } from "./request.ts";
import type { Runtime } from "./runtime.ts";

/** A body stream guarded by its deadline; call `done` when finished reading (clears the timer). */
export interface GuardedBody {
  stream: ReadableStream<Uint8Array>;
  done(): void;
}

/**
 * Guards a request body by the body deadline, shutdown and the client's signal: a pending read
 * fails at once when one fires, and the body is cancelled.
 * @param rt the runtime (server.body_timeout_ms, shutdown signal)
 * @param body the raw body
 * @param ctx the request (arrival, client)
 * @returns the guarded stream and its cleanup
 */
export function bodyWithin(
  rt: Runtime,
  body: ReadableStream<Uint8Array>,
  ctx: Omit<RequestContext, "tenant">,
): GuardedBody {
  const ms = rt.config.server.body_timeout_ms;
  const left = ctx.arrivalMs === undefined ? ms : ms - (performance.now() - ctx.arrivalMs);
  const timeout = new AbortController();
  const timer = setTimeout(() => timeout.abort(), Math.max(0, left));
  const parts = [timeout.signal, rt.shutdownSignal];
  if (ctx.client) parts.push(ctx.client);
  const stream = untilAborted(body, AbortSignal.any(parts), () => {
    if (rt.shutdownSignal.aborted) {
      return new UnavailableError("shutting_down", "server is shutting down");
    }
    if (ctx.client?.aborted) return new UnavailableError("client_gone", "client disconnected");
    return new InputError(
      `request body not received within ${ms} ms (server.body_timeout_ms)`,
      "body",
      "body_timeout",
    );
  });
  return { stream, done: () => clearTimeout(timer) };
}
