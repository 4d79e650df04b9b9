// Per-request values the base app records for every route (request id, arrival time, the API
// key's tenant) and the serving core's RequestContext built from them. Hono context variables,
// declared once here.
import type { Context } from "hono";
import { type RequestContext, tenantId } from "../../lib/serve/mod.ts";

declare module "hono" {
  interface ContextVariableMap {
    /** Sent back as x-request-id and logged with any internal error. */
    requestId: string;
    /** performance.now() when the request arrived. */
    arrivalMs: number;
    /** Tenant of the API key that authenticated the request ("anonymous" without keys). */
    keyTenant: string;
    /** request_timeout_ms of the tier serving the request, once the route knows it (bounds the
     *  response's write deadline; see response_deadline.ts). */
    requestTimeoutMs: number;
  }
}

/**
 * The serving core's view of a request.
 * @param c the Hono context
 * @param opts a signal that replaces the client's (e.g. linked to an SSE body's cancel) and the
 *   request's cache_salt
 * @returns the RequestContext
 */
export function requestContext(
  c: Context,
  opts: { signal?: AbortSignal; cacheSalt?: string | null } = {},
): RequestContext {
  return {
    client: opts.signal ?? c.req.raw.signal,
    arrivalMs: c.get("arrivalMs"),
    tenant: tenantId(c.get("keyTenant") ?? "anonymous", opts.cacheSalt),
  };
}

/**
 * The API key's tenant ("anonymous" without keys): the owner of the snapshots a request stores and
 * the scope of its user ids for sticky routing. A request's cache_salt does not enter: it scopes
 * prefix-cache sharing, and a client may choose any salt.
 * @param c the Hono context
 * @returns the tenant id
 */
export function keyTenant(c: Context): string {
  return c.get("keyTenant") ?? "anonymous";
}
