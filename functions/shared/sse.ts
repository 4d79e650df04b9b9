// Server-sent events for streamed completions: `data: <json>\n\n` frames ending with
// `data: [DONE]`. Cancelling the body (client gone) aborts the producer's signal so generation
// stops and frees its sequence. Not a general SSE library (no event names, ids or retry).

const enc = new TextEncoder();

/**
 * Builds a streaming SSE response.
 * @param produce writes frames with `send`; runs until done; `signal` aborts when the client
 *   cancels the body. Errors it throws become one `{error}` frame before `[DONE]`.
 * @param onCancel called once when the client cancels
 * @param errorFrame turns a thrown error into the object sent
 * @returns the Response (status 200, text/event-stream)
 */
export function sseResponse(
  produce: (send: (obj: unknown) => void) => Promise<void>,
  onCancel: () => void,
  errorFrame: (e: unknown) => unknown,
): Response {
  let cancelled = false;
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      const send = (obj: unknown) => {
        if (!cancelled) controller.enqueue(enc.encode(`data: ${JSON.stringify(obj)}\n\n`));
      };
      produce(send).catch((e) => send(errorFrame(e))).finally(() => {
        if (cancelled) return;
        controller.enqueue(enc.encode("data: [DONE]\n\n"));
        controller.close();
      });
    },
    cancel() {
      cancelled = true;
      onCancel();
    },
  });
  return new Response(body, {
    status: 200,
    headers: {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      "x-accel-buffering": "no",
    },
  });
}
