// The part every function app shares: one onError, JSON 404s, request counting, API-key auth on
// /v1/* (constant-time), and the probes GET /healthz, /readyz, /metrics. Each function adds its
// own routes on top (register* functions), so one app can hold one function or all of them.
import { Hono } from "hono";
import type { Context, MiddlewareHandler } from "hono";
import { bodyLimit } from "hono/body-limit";
import { type Runtime, UnavailableError } from "../../lib/serve/mod.ts";
import { errorHandler, HttpError } from "./errors.ts";

async function digest(s: string): Promise<Uint8Array> {
  return new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(s)));
}

/**
 * Compares a presented key with every configured key in constant time (per key: SHA-256 of both,
 * XOR-accumulated over all 32 bytes; every configured key is always compared).
 * @param presented the key from the request
 * @param keys configured keys
 * @returns whether it matches one
 */
export async function keyMatches(presented: string, keys: readonly string[]): Promise<boolean> {
  const p = await digest(presented);
  let ok = 0;
  for (const k of keys) {
    const d = await digest(k);
    let diff = 0;
    for (let i = 0; i < d.length; i++) diff |= d[i] ^ p[i];
    ok |= diff === 0 ? 1 : 0;
  }
  return ok === 1;
}

function authMiddleware(rt: Runtime): MiddlewareHandler {
  return async (c, next) => {
    const keys = rt.config.secrets.apiKeys;
    if (keys.length === 0) return await next();
    const auth = c.req.header("authorization") ?? "";
    const m = /^Bearer\s+(.+)$/i.exec(auth);
    const presented = m?.[1] ?? c.req.header("x-api-key");
    if (presented === undefined) {
      throw new HttpError(
        401,
        "authentication_error",
        "missing API key: send Authorization: Bearer <key>",
      );
    }
    if (!(await keyMatches(presented.trim(), keys))) {
      throw new HttpError(401, "authentication_error", "invalid API key");
    }
    await next();
  };
}

/**
 * A JSON body-size guard answering 413 in the error shape. A body without Content-Length is read
 * here; when that read fails (the client reset the connection mid-upload) the answer is a 400
 * naming "body", not an internal error.
 * @param maxBytes largest accepted body
 * @returns middleware
 */
export function jsonBodyLimit(maxBytes: number): MiddlewareHandler {
  const limit = bodyLimit({
    maxSize: maxBytes,
    onError: () => {
      throw new HttpError(
        413,
        "invalid_request_error",
        `request body exceeds ${maxBytes} bytes`,
        "body",
      );
    },
  });
  return async (c, next) => {
    let handled = false;
    try {
      await limit(c, async () => {
        handled = true;
        await next();
      });
    } catch (e) {
      if (handled || e instanceof HttpError) throw e;
      throw new HttpError(
        400,
        "invalid_request_error",
        `request body could not be read: ${(e as Error)?.message ?? String(e)}`,
        "body",
      );
    }
  };
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
  app.use("*", async (c, next) => {
    await next();
    rt.metrics.requests.inc({ function: fn, route: c.req.routePath, status: String(c.res.status) });
  });
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
  app.get("/metrics", (c) => {
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
