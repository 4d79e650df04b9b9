// HTTP request bodies of the functions: the snapshot media type, whether a request carries a
// snapshot, and the raw body stream whose read failures (a reset mid-upload) become a 400
// naming "body". Snapshot parsing itself is lib/snapshot's, orchestration lib/serve's.
import type { Context } from "hono";
import { HttpError } from "./errors.ts";

/** Media type of a KV snapshot body. */
export const SNAPSHOT_TYPE = "application/vnd.kvrelay.snapshot";

/**
 * Whether the request carries a snapshot body.
 * @param c the Hono context
 * @returns true for the snapshot media type
 */
export function isSnapshotBody(c: Context): boolean {
  return (c.req.header("content-type") ?? "").split(";")[0].trim().toLowerCase() === SNAPSHOT_TYPE;
}

/**
 * The request body, whose read failures (the client reset the connection mid-upload, a broken
 * chunked encoding) surface as a 400 naming "body" instead of an internal error.
 * @param c the Hono context
 * @returns the body stream, or null when the request has none
 */
export function requestBody(c: Context): ReadableStream<Uint8Array> | null {
  const body = c.req.raw.body;
  if (!body) return null;
  const reader = body.getReader();
  return new ReadableStream<Uint8Array>({
    async pull(ctl) {
      let r: ReadableStreamReadResult<Uint8Array>;
      try {
        r = await reader.read();
      } catch (e) {
        ctl.error(
          new HttpError(
            400,
            "invalid_request_error",
            `request body could not be read: ${(e as Error)?.message ?? String(e)}`,
            "body",
          ),
        );
        return;
      }
      if (r.done) ctl.close();
      else ctl.enqueue(r.value);
    },
    cancel(why) {
      return reader.cancel(why);
    },
  });
}
