// Server-sent events for streamed completions, on Hono's streamSSE: `data: <json>\n\n` frames
// ending with `data: [DONE]` (OpenAI's framing). Cancelling the body (client gone) aborts the
// producer's signal so generation stops and frees its sequence. No event names, ids or retry.
import type { Context } from "hono";
import { setImmediate } from "node:timers";
import { streamSSE } from "hono/streaming";

/**
 * Builds a streaming SSE response.
 * @param c the request's context (headers already set on it are kept)
 * @param produce writes frames with `send`; runs until done. Errors it throws become one
 *   `{error}` frame before `[DONE]`.
 * @param onCancel called once when the client cancels the body
 * @param errorFrame turns a thrown error into the object sent
 * @returns the Response (status 200, text/event-stream)
 */
export function sseResponse(
  c: Context,
  produce: (send: (obj: unknown) => void) => Promise<void>,
  onCancel: () => void,
  errorFrame: (e: unknown) => unknown,
): Response {
  const res = streamSSE(c, async (stream) => {
    stream.onAbort(onCancel);
    // Frames are queued, not awaited: a client that reads slowly must not stall the decode loop
    // and hold engine capacity (what is queued is bounded by max_tokens). stream.write hands the
    // bytes to the stream's writer at once, in call order, before streamSSE closes it; writeSSE
    // would first await a callback resolution, so an unawaited last frame could land after the
    // close. The framing is OpenAI's: one `data:` line (JSON has no raw newline) and a blank line.
    // Frames sent in one turn of the event loop (a burst of decode steps hands a request several
    // tokens at once) go out as one write: each write is a chunk through the body's stream and
    // the socket, which per token cost more than the frame itself.
    let pending = "";
    let scheduled = false;
    const flush = () => {
      scheduled = false;
      if (pending !== "" && !stream.aborted) void stream.write(pending);
      pending = "";
    };
    const write = (data: string) => {
      if (stream.aborted) return;
      pending += `data: ${data}\n\n`;
      if (!scheduled) {
        scheduled = true;
        setImmediate(flush);
      }
    };
    const send = (obj: unknown) => write(JSON.stringify(obj));
    try {
      await produce(send);
    } catch (e) {
      send(errorFrame(e));
    }
    write("[DONE]");
    flush();
  });
  // streamSSE's hop-by-hop headers are the server's business (Deno chunks by itself; HTTP/2
  // forbids them); proxies must not buffer the stream.
  res.headers.delete("transfer-encoding");
  res.headers.delete("connection");
  res.headers.set("content-type", "text/event-stream; charset=utf-8");
  res.headers.set("x-accel-buffering", "no");
  return res;
}
