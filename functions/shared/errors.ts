// The one mapping from thrown errors to HTTP responses shared by every function's app.onError.
// Shape follows OpenAI's: {error: {type, message, param}}; never a stack trace in a body.
// Domain errors of lib/ (lib/serve's input/not-found/unavailable/too-large/mismatch errors,
// SnapshotError, StoreError, QueueFullError, migration refusals) map here and nowhere else;
// HttpError is for what only HTTP knows (a body that cannot be read, a size limit of the route).
import type { Context } from "hono";
import { HTTPException } from "hono/http-exception";
import { z } from "zod";
import { MigrationRefusedError } from "../../lib/migrate/mod.ts";
import {
  BusyError,
  InputError,
  type Metrics,
  NonFiniteLogitsError,
  NotFoundError,
  QueueFullError,
  SnapshotMismatchError,
  TooLargeError,
  UnavailableError,
} from "../../lib/serve/mod.ts";
import { SnapshotError } from "../../lib/snapshot/mod.ts";
import { StoreError } from "../../lib/store/mod.ts";
import "./context.ts";

/** Statuses a handler may answer with on purpose. */
export type ErrorStatus =
  | 400
  | 401
  | 404
  | 405
  | 408
  | 409
  | 413
  | 415
  | 422
  | 429
  | 431
  | 503
  | 504;

/** An error a handler throws on purpose, carrying its HTTP status and OpenAI-style type. */
export class HttpError extends Error {
  /**
   * @param status HTTP status code to answer with.
   * @param type OpenAI-style error type, e.g. "invalid_request_error".
   * @param message Human-readable message quoting the offending value.
   * @param param Request field at fault, when there is one.
   * @param headers Extra response headers (e.g. Retry-After).
   */
  constructor(
    readonly status: ErrorStatus,
    readonly type: string,
    message: string,
    readonly param?: string,
    readonly headers?: Record<string, string>,
  ) {
    super(message);
    this.name = "HttpError";
  }
}

const MISMATCH_REASONS = new Set<string>([
  "tokenizer_mismatch",
  "source_mismatch",
  "target_mismatch",
  "geometry_mismatch",
]);

const SNAPSHOT_STATUS: Record<SnapshotError["kind"], ErrorStatus> = {
  fingerprint: 409,
  signature: 401,
  too_large: 413,
  checksum: 400,
  version: 400,
  bounds: 400,
  format: 400,
};

/**
 * Classifies a thrown value as an {@link HttpError} (or null for an internal error).
 * @param err what a handler threw
 * @returns the HTTP error to answer with, or null for a 500
 */
export function toHttpError(err: unknown): HttpError | null {
  if (err instanceof HttpError) return err;
  if (err instanceof z.ZodError) {
    const issue = err.issues[0];
    if (issue?.code === "unrecognized_keys") {
      // OpenAI's policy for fields it does not know: refuse, naming the field.
      const param = [...issue.path.map(String), issue.keys[0]].join(".");
      return new HttpError(
        400,
        "invalid_request_error",
        `Unrecognized request argument supplied: ${param}`,
        param,
      );
    }
    const param = issue && issue.path.length > 0 ? issue.path.map(String).join(".") : "body";
    return new HttpError(
      400,
      "invalid_request_error",
      issue ? `${param}: ${issue.message}` : "invalid request body",
      param,
    );
  }
  if (err instanceof InputError) {
    if (err.code === "body_timeout") {
      return new HttpError(408, "timeout_error", err.message, err.param);
    }
    return new HttpError(
      400,
      err.code === "context_length_exceeded" ? "context_length_exceeded" : "invalid_request_error",
      err.message,
      err.param,
    );
  }
  if (err instanceof BusyError) {
    return new HttpError(429, "rate_limit_error", err.message, undefined, {
      "retry-after": String(err.retryAfterS),
    });
  }
  if (err instanceof UnavailableError) {
    return new HttpError(
      503,
      err.reason === "timeout" ? "timeout_error" : "unavailable_error",
      err.message,
      undefined,
      // A draining process: the client should retry, on another instance.
      err.reason === "shutting_down" ? { "retry-after": "1" } : undefined,
    );
  }
  if (err instanceof NotFoundError) {
    return new HttpError(404, "not_found_error", err.message, err.param);
  }
  if (err instanceof TooLargeError) {
    return new HttpError(413, "invalid_request_error", err.message, err.param);
  }
  if (err instanceof NonFiniteLogitsError) {
    // The request cannot be completed as given (its cache or the model overflows), and retrying
    // it unchanged fails the same way: a 422 naming the cause, never a generic 500.
    return new HttpError(422, "non_finite_logits_error", err.message);
  }
  if (err instanceof SnapshotMismatchError) {
    return new HttpError(409, "snapshot_mismatch_error", err.message, err.param);
  }
  if (err instanceof QueueFullError) {
    return new HttpError(429, "rate_limit_error", err.message, undefined, {
      "retry-after": String(err.retryAfterS),
    });
  }
  if (err instanceof SnapshotError) {
    const type = err.kind === "fingerprint"
      ? "snapshot_mismatch_error"
      : err.kind === "signature"
      ? "authentication_error"
      : "invalid_snapshot_error";
    return new HttpError(SNAPSHOT_STATUS[err.kind], type, `snapshot ${err.kind}: ${err.message}`);
  }
  if (err instanceof StoreError) {
    // The store's own message may name its address or internal keys: never sent (it is logged).
    if (err.kind === "too_large") {
      return new HttpError(413, "invalid_request_error", "snapshot is too large for the store");
    }
    return new HttpError(503, "store_unavailable_error", "snapshot store is unavailable");
  }
  if (err instanceof MigrationRefusedError) {
    // One rule for a snapshot that does not fit: a mismatch (tokenizer, model, geometry) is a
    // 409 like a snapshot of a model no tier serves; a refusal by policy (no projector, quality
    // gate) is a 422.
    return MISMATCH_REASONS.has(err.reason)
      ? new HttpError(409, "snapshot_mismatch_error", err.message)
      : new HttpError(422, "migration_refused_error", err.message);
  }
  if (err instanceof HTTPException) {
    return new HttpError(err.status as ErrorStatus, "invalid_request_error", err.message);
  }
  // Anything else — a TypeError or RangeError from a bug included — is internal: a 500.
  return null;
}

/**
 * Names the request field a snapshot or migration error is about: a SnapshotError, the 409 of a
 * snapshot no tier serves, and a migration refusal carry no field of their own, and only the
 * route knows whether the snapshot came as the body or by `snapshot_id`, and which field named
 * the target tier.
 * @param err what a handler threw
 * @param fields the field holding the snapshot, and the one naming the tier it goes to
 * @returns an HttpError naming that field, or `err` unchanged for any other error
 */
export function blameSnapshot(err: unknown, fields: { snapshot: string; tier: string }): unknown {
  const h = toHttpError(err);
  if (!h || h.param !== undefined) return err;
  const param = err instanceof SnapshotError || h.type === "snapshot_mismatch_error"
    ? fields.snapshot
    : h.type === "migration_refused_error"
    ? fields.tier
    : undefined;
  return param === undefined ? err : new HttpError(h.status, h.type, h.message, param, h.headers);
}

/**
 * The JSON error body of a thrown value; an internal error is logged with the request id and
 * answered with a generic message.
 * @param err what was thrown
 * @param requestId the request's id (logged, and quoted in the generic message)
 * @returns the status, the body and extra headers
 */
export function errorBody(
  err: unknown,
  requestId = "-",
): { status: ErrorStatus | 500; body: { error: Record<string, unknown> }; headers: Headers } {
  const h = toHttpError(err);
  if (!h) {
    if (err instanceof StoreError) console.error(`[${requestId}] store error:`, err);
    console.error(`[${requestId}] internal error:`, err);
    return {
      status: 500,
      body: {
        error: {
          type: "server_error",
          message: `internal server error (request ${requestId})`,
          param: null,
        },
      },
      headers: new Headers(),
    };
  }
  if (err instanceof StoreError) console.error(`[${requestId}] store error:`, err.message);
  return {
    status: h.status,
    body: { error: { type: h.type, message: h.message, param: h.param ?? null } },
    headers: new Headers(h.headers ?? {}),
  };
}

/**
 * Builds the app.onError handler: maps any thrown value to a JSON error response and counts it.
 * @param metrics where error counts go (optional)
 * @returns a Hono error handler
 */
export function errorHandler(metrics?: Metrics): (err: unknown, c: Context) => Response {
  return (err, c) => {
    if (err instanceof HTTPException && err.res) {
      // A middleware's own answer (bearerAuth: 401/400 with WWW-Authenticate, in our shape).
      metrics?.errors.inc({
        type: err.status === 401 ? "authentication_error" : "invalid_request_error",
      });
      return err.getResponse();
    }
    const h = toHttpError(err);
    if (!h) {
      const { body } = errorBody(err, c.get("requestId"));
      metrics?.errors.inc({ type: "server_error" });
      return c.json(body, 500);
    }
    if (err instanceof StoreError) {
      console.error(`[${c.get("requestId")}] store error:`, err.message);
    }
    metrics?.errors.inc({ type: h.type });
    for (const [k, v] of Object.entries(h.headers ?? {})) c.header(k, v);
    return c.json(
      { error: { type: h.type, message: h.message, param: h.param ?? null } },
      h.status,
    );
  };
}

/**
 * Turns any thrown value into a JSON error response (no metrics).
 * @param err What a handler threw.
 * @param c The Hono context of the failed request.
 * @returns The response to send.
 */
export function errorResponse(err: unknown, c: Context): Response {
  return errorHandler()(err, c);
}
