// What the serving core needs to know about the request it serves, beyond its inputs: the
// client's abort signal, when it arrived (deadlines count from arrival, body upload included),
// and its tenant (whose prefix cache it may read and write). Built by functions/ per request.

/** Per-request context passed into the serving core. */
export interface RequestContext {
  /** Aborts when the client goes away. */
  client?: AbortSignal;
  /** performance.now() at arrival; the tier's request_timeout_ms counts from here (default:
   *  when the core first sees the request). */
  arrivalMs?: number;
  /** The tenant: prefix-cache entries are keyed per tenant, and reuse is reported only within it
   *  (an API key's identity, plus a request's cache_salt). */
  tenant: string;
}

/**
 * The tenant id of a request from its key identity and an optional cache_salt (unambiguous for
 * any pair of strings).
 * @param keyTenant the API key's tenant (or "anonymous" without keys)
 * @param cacheSalt the request's cache_salt, when given
 * @returns the tenant id
 */
export function tenantId(keyTenant: string, cacheSalt?: string | null): string {
  return JSON.stringify([keyTenant, cacheSalt ?? null]);
}
