// HTTP request bodies of the functions: the snapshot media type, whether a request carries a
// snapshot, the raw body stream whose read failures (a reset mid-upload) become a 400 naming
// "body", and the one strict JSON body reader every JSON route uses. Snapshot parsing itself is
// lib/snapshot's, orchestration lib/serve's.
import type { Context } from "hono";
import { bodyWithin, type Runtime } from "../../lib/serve/mod.ts";
import "./context.ts";
import { HttpError } from "./errors.ts";

/** Media type of a KV snapshot body. */
export const SNAPSHOT_TYPE = "application/vnd.kvrelay.snapshot";

/** Media types a snapshot upload may carry: ours, and the generic binary type (curl, fetch of a
 *  file). Either way the parser checks the magic first and treats every byte as hostile, so a
 *  body that is not a snapshot is a 400 naming "body" after its first bytes. */
const SNAPSHOT_TYPES: readonly string[] = [SNAPSHOT_TYPE, "application/octet-stream"];

function mediaType(c: Context): string {
  return (c.req.header("content-type") ?? "").split(";")[0].trim().toLowerCase();
}

/**
 * Whether the request carries a snapshot body.
 * @param c the Hono context
 * @returns true for the snapshot media type or application/octet-stream
 */
export function isSnapshotBody(c: Context): boolean {
  return SNAPSHOT_TYPES.includes(mediaType(c));
}

/**
 * For routes that take a snapshot body or a JSON body (decode, migrate): which one this request
 * carries. Any other type, or none, is a 415 naming both: a request without a content type, or
 * with text/plain, form or multipart, is one a web page can send cross-site without asking (a
 * CORS "simple" request), so it must not reach the engine — the rule JSON routes follow too.
 * @param c the Hono context
 * @returns true for a snapshot body, false for application/json
 * @throws {HttpError} 415 naming `content-type`
 */
export function snapshotOrJson(c: Context): boolean {
  if (isSnapshotBody(c)) return true;
  if (isJsonBody(c)) return false;
  const got = c.req.header("content-type");
  throw new HttpError(
    415,
    "invalid_request_error",
    `Content-Type must be ${SNAPSHOT_TYPE} (or application/octet-stream) for a snapshot body, ` +
      `or application/json for {"snapshot_id": ...}${
        got === undefined ? " (none was sent)" : `, got ${JSON.stringify(got)}`
      }; with curl: -H 'content-type: ${SNAPSHOT_TYPE}' --data-binary @snapshot.kvs`,
    "content-type",
  );
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

const fatalUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: false });

/**
 * The path of the first string (or key) holding a lone surrogate, or null. Iterative (an explicit
 * stack, depth-first in document order), so a body nested as deep as its byte bound allows cannot
 * overflow the call stack.
 * @param root a parsed JSON value
 * @returns the path, or null when every string is well formed
 */
export function illFormedPath(root: unknown): string[] | null {
  // A frame's path is rebuilt only for the one bad string: each frame points at its parent.
  type Frame = { value: unknown; key: string | null; parent: Frame | null };
  const pathOf = (f: Frame | null, last?: string): string[] => {
    const path: string[] = last === undefined ? [] : [last];
    for (let p = f; p !== null && p.key !== null; p = p.parent) path.push(p.key);
    return path.reverse();
  };
  const stack: Frame[] = [{ value: root, key: null, parent: null }];
  while (stack.length > 0) {
    const f = stack.pop()!;
    const v = f.value;
    if (typeof v === "string") {
      if (!v.isWellFormed()) return pathOf(f);
    } else if (Array.isArray(v)) {
      for (let i = v.length - 1; i >= 0; i--) {
        stack.push({ value: v[i], key: String(i), parent: f });
      }
    } else if (v !== null && typeof v === "object") {
      const entries = Object.entries(v);
      // Keys are checked when their object is reached, before any of its values.
      for (const [k] of entries) if (!k.isWellFormed()) return pathOf(f, k);
      for (let i = entries.length - 1; i >= 0; i--) {
        stack.push({ value: entries[i][1], key: entries[i][0], parent: f });
      }
    }
  }
  return null;
}

/**
 * How deeply a parsed JSON value nests (arrays and objects), computed iteratively.
 * @param root a parsed JSON value
 * @param limit stop counting once deeper than this
 * @returns the depth (0 for a scalar), at most `limit + 1`
 */
export function jsonDepth(root: unknown, limit: number): number {
  let deepest = 0;
  const stack: [unknown, number][] = [[root, 0]];
  while (stack.length > 0) {
    const [v, d] = stack.pop()!;
    if (v === null || typeof v !== "object") continue;
    const depth = d + 1;
    if (depth > deepest) deepest = depth;
    if (deepest > limit) return deepest;
    for (const x of Array.isArray(v) ? v : Object.values(v)) {
      if (x !== null && typeof x === "object") stack.push([x, depth]);
    }
  }
  return deepest;
}

/** Deepest nesting of arrays and objects a JSON body may have; no request of any route needs
 *  more than a few levels, and deeper values would reach code that walks them recursively
 *  (schema validation of an unknown field's value, error messages, logging). */
export const MAX_JSON_DEPTH = 64;

/**
 * Whether the request says its body is JSON (`application/json`, any parameters).
 * @param c the Hono context
 * @returns true for application/json
 */
export function isJsonBody(c: Context): boolean {
  return mediaType(c) === "application/json";
}

/**
 * Reads a JSON request body the strict way: `Content-Type: application/json` (else 415, so a web
 * page cannot send one as a CORS "simple" request), at most `server.max_body_bytes` (413), the
 * whole body within the body deadline (408), its bytes charged to the process's body budget as
 * they arrive and returned once it is parsed (429 when the budget is full), valid UTF-8 (400),
 * valid JSON (400) nested at most {@link MAX_JSON_DEPTH} deep (400), with no lone surrogates in
 * any string (400 naming the field).
 * @param c the Hono context
 * @param rt the runtime (limits, deadline, body budget)
 * @returns the parsed body
 * @throws {HttpError} 415, 413, 400; {@link InputError} body_timeout (408); {@link BusyError}
 *   body budget full (429)
 */
export async function readJson(c: Context, rt: Runtime): Promise<unknown> {
  if (!isJsonBody(c)) {
    const got = c.req.header("content-type");
    throw new HttpError(
      415,
      "invalid_request_error",
      `Content-Type must be application/json${
        got === undefined ? " (none was sent)" : `, got ${JSON.stringify(got)}`
      }`,
      "content-type",
    );
  }
  const max = rt.config.server.max_body_bytes;
  const tooLarge = () =>
    new HttpError(413, "invalid_request_error", `request body exceeds ${max} bytes`, "body");
  const declared = Number(c.req.header("content-length") ?? "0");
  if (declared > max) throw tooLarge();
  const raw = requestBody(c);
  if (!raw) return parseJson(new Uint8Array(0));
  const guarded = bodyWithin(rt, raw, {
    client: c.req.raw.signal,
    arrivalMs: c.get("arrivalMs"),
  });
  try {
    const parts: Uint8Array[] = [];
    let n = 0;
    try {
      for await (const p of guarded.stream) {
        n += p.length;
        if (n > max) {
          await guarded.stream.cancel().catch(() => {});
          throw tooLarge();
        }
        parts.push(p);
      }
    } finally {
      guarded.done();
    }
    // The joined copy is held beside the parts until they are dropped: charge it too.
    guarded.hold.add(n);
    const bytes = new Uint8Array(n);
    let o = 0;
    for (const p of parts) {
      bytes.set(p, o);
      o += p.length;
    }
    parts.length = 0;
    return parseJson(bytes);
  } finally {
    guarded.release();
  }
}

/** Decodes and parses a JSON body, refusing invalid UTF-8, invalid JSON, too deep a nesting and
 *  lone surrogates. */
function parseJson(bytes: Uint8Array): unknown {
  let text: string;
  try {
    text = fatalUtf8.decode(bytes);
  } catch {
    throw new HttpError(400, "invalid_request_error", "request body is not valid UTF-8", "body");
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new HttpError(400, "invalid_request_error", "request body is not valid JSON", "body");
  }
  if (jsonDepth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH) {
    throw new HttpError(
      400,
      "invalid_request_error",
      `request body nests arrays and objects more than ${MAX_JSON_DEPTH} deep`,
      "body",
    );
  }
  const bad = illFormedPath(value);
  if (bad) {
    const param = bad.length > 0 ? bad.join(".") : "body";
    throw new HttpError(
      400,
      "invalid_request_error",
      `${param}: string holds a lone UTF-16 surrogate (not valid Unicode)`,
      param,
    );
  }
  return value;
}

/**
 * The query string's parameters, decoded strictly: a value that is not valid percent-encoded
 * UTF-8 is a 400 naming it (URLSearchParams would replace it with U+FFFD silently). Last value
 * wins for a repeated name.
 * @param c the Hono context
 * @returns name → value
 * @throws {HttpError} 400 naming the parameter
 */
export function strictQuery(c: Context): Record<string, string> {
  const url = c.req.url;
  const q = url.indexOf("?");
  const out: Record<string, string> = {};
  if (q < 0) return out;
  const decode = (s: string, param: string) => {
    try {
      return decodeURIComponent(s.replaceAll("+", " "));
    } catch {
      throw new HttpError(
        400,
        "invalid_request_error",
        `query parameter ${JSON.stringify(param)} is not valid percent-encoded UTF-8`,
        param,
      );
    }
  };
  for (const part of url.slice(q + 1).split("#")[0].split("&")) {
    if (part === "") continue;
    const eq = part.indexOf("=");
    const rawName = eq < 0 ? part : part.slice(0, eq);
    const name = decode(rawName, rawName);
    out[name] = eq < 0 ? "" : decode(part.slice(eq + 1), name);
  }
  return out;
}
