// Write deadlines of the functions' responses: an answer (an SSE stream, a relayed peer answer, a
// JSON body) must be taken by its client within the request deadline — the tier's
// request_timeout_ms from the request's arrival when the route named a tier, else the longest of
// any tier — or it is aborted (the connection is cut) and what produces it is cancelled (an SSE
// stream's generation stops and frees its sequence). Snapshot downloads are bounded by their tier
// slot's own deadline in lib/serve (export.ts), which frees the slot and the sequence with them.
import type { Context, MiddlewareHandler } from "hono";
import { deadlineSignal, type Runtime, type Tier, writeWithin } from "../../lib/serve/mod.ts";
import { SNAPSHOT_TYPE } from "./body.ts";
import "./context.ts";

/** JSON answers up to this size are handed to the server whole: the socket's buffers take them
 *  at once, so there is nothing for a client to hold by not reading. */
const SMALL_JSON_BYTES = 64 * 1024;
/** Larger JSON answers are written in pieces of this size, under the deadline. */
const PIECE_BYTES = 64 * 1024;

/**
 * Records the tier a request is served by: its request_timeout_ms bounds the response's write
 * deadline (and the request's other deadlines, which lib/serve applies itself).
 * @param c the Hono context
 * @param tier the tier
 */
export function deadlineTier(c: Context, tier: Tier): void {
  const ms = tier.config.request_timeout_ms;
  const had = c.get("requestTimeoutMs");
  c.set("requestTimeoutMs", had === undefined ? ms : Math.max(had, ms));
}

/**
 * The middleware bounding every response body of the routes it covers by the write deadline.
 * @param rt the runtime (tiers' deadlines, metrics)
 * @returns the middleware
 */
export function responseDeadline(rt: Runtime): MiddlewareHandler {
  const longest = Math.max(...Object.values(rt.config.tiers).map((t) => t.request_timeout_ms));
  return async (c, next) => {
    await next();
    const res = c.res;
    if (!res.body) return;
    const type = (res.headers.get("content-type") ?? "").split(";")[0].trim().toLowerCase();
    if (type === SNAPSHOT_TYPE) return;
    const ms = c.get("requestTimeoutMs") ?? longest;
    if (type === "application/json") {
      // GET answers (/v1/models) are small and cheap: only what a POST produced is bounded.
      if (c.req.method !== "POST") return;
      const bytes = new Uint8Array(await res.arrayBuffer());
      const headers = new Headers(res.headers);
      headers.set("content-length", String(bytes.length));
      const init = { status: res.status, statusText: res.statusText, headers };
      if (bytes.length <= SMALL_JSON_BYTES) {
        c.res = new Response(bytes, init);
        return;
      }
      c.res = new Response(guard(c, rt, ms, pieces(bytes), "json"), init);
      return;
    }
    c.res = new Response(
      guard(c, rt, ms, res.body, type === "text/event-stream" ? "sse" : "relay"),
      {
        status: res.status,
        statusText: res.statusText,
        headers: res.headers,
      },
    );
  };
}

function guard(
  c: Context,
  rt: Runtime,
  ms: number,
  body: ReadableStream<Uint8Array>,
  kind: string,
): ReadableStream<Uint8Array> {
  const d = deadlineSignal(c.get("arrivalMs"), ms);
  return writeWithin(body, d.signal, {
    onExpire: () => rt.metrics.writeTimeouts.inc({ body: kind }),
    onFinish: d.clear,
  });
}

function pieces(bytes: Uint8Array): ReadableStream<Uint8Array> {
  let o = 0;
  return new ReadableStream<Uint8Array>({
    pull(ctl) {
      if (o >= bytes.length) return ctl.close();
      ctl.enqueue(bytes.subarray(o, o + PIECE_BYTES));
      o += PIECE_BYTES;
    },
  }, { highWaterMark: 0 });
}
