// The part every function app shares: one onError, JSON 404/405/431s, request ids, request
// counting, CORS only when configured, API-key auth on /v1/* (Hono's bearerAuth, every configured
// key compared in constant time, the matching key's tenant recorded), and the probes GET /healthz,
// /readyz, /metrics. Each function adds its own routes on top (register* functions), so one app
// can hold one function or all of them.
import { Hono } from "hono";
import type { Context, MiddlewareHandler } from "hono";
import { bearerAuth } from "hono/bearer-auth";
import { cors } from "hono/cors";
import { requestId } from "hono/request-id";
import { type Runtime, UnavailableError } from "../../lib/serve/mod.ts";
import { hex, sha256 } from "../../lib/util/mod.ts";
import "./context.ts";
import { errorHandler } from "./errors.ts";
import { responseDeadline } from "./response_deadline.ts";

/** Largest total request-header size the app accepts (names + values); larger → JSON 431. Deno's
 *  own HTTP/1 parser answers an empty 400 before the app runs when the request head reaches
 *  64 KiB (docs/http.md "Headers"). */
export const MAX_HEADER_BYTES = 32 * 1024;
/** Most header fields the app accepts; more → JSON 431. Deno's parser refuses more than 128 lines
 *  with an empty 400 before the app runs. */
export const MAX_HEADER_COUNT = 100;

/**
 * Which configured key a presented key is, comparing in constant time (per key: SHA-256 of both,
 * XOR-accumulated over all 32 bytes; every configured key is always compared).
 * @param presented the key from the request
 * @param digests SHA-256 of each configured key
 * @returns the index of the matching key, or -1
 */
export async function keyIndex(presented: string, digests: readonly Uint8Array[]): Promise<number> {
  const p = await sha256(new TextEncoder().encode(presented));
  let found = -1;
  for (let i = 0; i < digests.length; i++) {
    const d = digests[i];
    let diff = 0;
    for (let j = 0; j < d.length; j++) diff |= d[j] ^ p[j];
    // Branch-free select: every key costs the same whatever matches.
    const eq = ((diff - 1) >> 31) & 1;
    found = eq * i + (1 - eq) * found;
  }
  return found;
}

/**
 * Whether a presented key matches one of `keys` (constant time over all keys).
 * @param presented the key from the request
 * @param keys configured keys
 * @returns whether it matches one
 */
export async function keyMatches(presented: string, keys: readonly string[]): Promise<boolean> {
  const digests = await Promise.all(keys.map((k) => sha256(new TextEncoder().encode(k))));
  return (await keyIndex(presented, digests)) >= 0;
}

function authError(message: string) {
  return { error: { type: "authentication_error", message, param: null } };
}

function authMiddleware(rt: Runtime): MiddlewareHandler {
  const { apiKeys, apiKeyTenants } = rt.config.secrets;
  if (apiKeys.length === 0) {
    return async (c, next) => {
      c.set("keyTenant", "anonymous");
      await next();
    };
  }
  // A key's tenant: its configured `tenant:` id, else the key's own identity (a digest prefix:
  // stable, and it reveals nothing of the key).
  const identity = (async () => {
    const digests = await Promise.all(apiKeys.map((k) => sha256(new TextEncoder().encode(k))));
    const tenants = digests.map((d, i) => apiKeyTenants[i] ?? `key:${hex(d).slice(0, 16)}`);
    return { digests, tenants };
  })();
  return bearerAuth({
    verifyToken: async (token, c) => {
      const { digests, tenants } = await identity;
      const i = await keyIndex(token, digests);
      if (i < 0) return false;
      c.set("keyTenant", tenants[i]);
      return true;
    },
    noAuthenticationHeader: {
      message: authError("missing API key: send Authorization: Bearer <key>"),
    },
    invalidAuthenticationHeader: {
      // `tenant:key` is how KVRELAY_API_KEYS lists a key; the header carries the key alone.
      message: (c) =>
        authError(
          /^Bearer\s+[^\s:]+:/i.test(c.req.header("authorization") ?? "")
            ? "malformed Authorization header: send Authorization: Bearer <key> with the key " +
              "alone (a `tenant:` prefix belongs only in the configured key list)"
            : "malformed Authorization header: send Authorization: Bearer <key>",
        ),
    },
    invalidToken: { message: authError("invalid API key") },
  });
}

// GET /metrics behind auth.metrics_key_env's key when one is configured (its series name tiers,
// routes and error counts: an operator may not want them public); else open, like the probes.
function metricsAuth(rt: Runtime): MiddlewareHandler {
  const key = rt.config.secrets.metricsKey;
  if (key === null) return async (_c, next) => await next();
  const digest = sha256(new TextEncoder().encode(key));
  return bearerAuth({
    verifyToken: async (token) => (await keyIndex(token, [await digest])) === 0,
    noAuthenticationHeader: {
      message: authError("missing metrics key: send Authorization: Bearer <key>"),
    },
    invalidAuthenticationHeader: {
      message: authError("malformed Authorization header: send Authorization: Bearer <key>"),
    },
    invalidToken: { message: authError("invalid metrics key") },
  });
}

function headerSize(headers: Headers): { bytes: number; count: number } {
  let bytes = 0, count = 0;
  for (const [k, v] of headers) {
    bytes += k.length + v.length + 4;
    count++;
  }
  return { bytes, count };
}

/**
 * Builds the shared base of a function app.
 * @param rt the runtime
 * @param fn function name (metrics label)
 * @returns a Hono app with error handling, auth, probes
 */
export function createBaseApp(rt: Runtime, fn: string): Hono {
  const app = new Hono();
  app.onError(errorHandler(rt.metrics));
  app.notFound((c) => {
    // A path served with other methods: 405 with Allow, not a 404.
    const allow = new Set<string>();
    for (const r of app.routes) {
      if (r.path === c.req.path && r.method !== "ALL") allow.add(r.method);
    }
    if (allow.has("GET")) allow.add("HEAD");
    if (allow.size > 0) {
      rt.metrics.errors.inc({ type: "method_not_allowed_error" });
      c.header("allow", [...allow].sort().join(", "));
      return c.json({
        error: {
          type: "method_not_allowed_error",
          message: `${c.req.method} is not allowed on ${c.req.path}; allowed: ${
            [...allow].sort().join(", ")
          }`,
          param: null,
        },
      }, 405);
    }
    rt.metrics.errors.inc({ type: "not_found_error" });
    return c.json(
      {
        error: {
          type: "not_found_error",
          message: `no route ${c.req.method} ${c.req.path}`,
          param: null,
        },
      },
      404,
    );
  });
  app.use("*", requestId({ limitLength: 64 }));
  app.use("*", async (c, next) => {
    c.set("arrivalMs", performance.now());
    await next();
    rt.metrics.requests.inc({ function: fn, route: c.req.routePath, status: String(c.res.status) });
  });
  app.use("*", async (c, next) => {
    const { bytes, count } = headerSize(c.req.raw.headers);
    const over = bytes > MAX_HEADER_BYTES
      ? `request headers total ${bytes} bytes, above the limit of ${MAX_HEADER_BYTES}`
      : count > MAX_HEADER_COUNT
      ? `${count} request header fields, above the limit of ${MAX_HEADER_COUNT}`
      : null;
    if (over !== null) {
      rt.metrics.errors.inc({ type: "invalid_request_error" });
      return c.json(
        { error: { type: "invalid_request_error", message: over, param: "headers" } },
        431,
      );
    }
    await next();
  });
  const origins = rt.config.server.cors_origins;
  if (origins.length > 0) {
    app.use(
      "*",
      cors({
        origin: origins,
        allowMethods: ["GET", "POST", "OPTIONS"],
        allowHeaders: ["authorization", "content-type"],
        exposeHeaders: ["x-request-id", "retry-after"],
        maxAge: 600,
      }),
    );
  }
  app.use("/v1/*", responseDeadline(rt));
  app.use("/v1/*", authMiddleware(rt));
  app.get("/healthz", (c) => c.json({ status: "ok" }));
  app.get("/readyz", (c) => {
    if (rt.draining) throw new UnavailableError("shutting_down", "server is shutting down");
    if (!rt.ready) {
      // Which tiers are loaded so far, beside the usual error body.
      const loading = Object.entries(rt.startup.tiers).filter(([, t]) => t.state !== "ready");
      return c.json({
        error: {
          type: "unavailable_error",
          message: `models are still loading (${
            loading.map(([n, t]) => `${n}: ${t.state}`).join(", ")
          })`,
          param: null,
        },
        tiers: rt.startup.tiers,
      }, 503);
    }
    // A device fault (CUDA) makes a tier unusable until the process restarts: not ready.
    for (const [name, t] of rt.tiers) {
      const why = t.model.native.health();
      if (why !== null) throw new UnavailableError("device_failed", `tier ${name}: ${why}`);
    }
    const backends = Object.fromEntries(
      [...rt.tiers].map(([name, t]) => [name, {
        backend: t.model.native.backend,
        device: t.model.native.device,
        info: t.model.native.deviceInfo,
      }]),
    );
    return c.json({
      status: "ready",
      tiers: [...rt.tiers.keys()],
      backends,
      startup: rt.startup,
    });
  });
  app.get("/metrics", metricsAuth(rt), (c) => {
    c.header("content-type", "text/plain; version=0.0.4; charset=utf-8");
    return c.body(rt.metrics.render());
  });
  return app;
}

/**
 * Headers for a call to a peer function (its API key when this deployment has keys).
 * @param rt the runtime
 * @returns headers
 */
export function peerHeaders(rt: Runtime): Record<string, string> {
  const k = rt.config.secrets.apiKeys[0];
  return k ? { authorization: `Bearer ${k}` } : {};
}

/** Client disconnect signal of a request. */
export function clientSignal(c: Context): AbortSignal {
  return c.req.raw.signal;
}
