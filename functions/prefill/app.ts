// The prefill function: POST /v1/prefill {tier, prompt | messages | tokens, store?, forward_to?}
// prefills all prompt tokens but the last (reusing the tier's prefix cache) and answers with the
// KV snapshot (streamed, HMAC-signed when a key is configured; the last token rides as pending so
// the importer computes the next-token logits itself), or stores it ({snapshot_id}), or streams
// it to a peer decode function and relays that answer (cross-process handoff).
import type { Hono } from "hono";
import { z } from "zod";
import {
  NotFoundError,
  prefillSnapshot,
  promptIds,
  requireTier,
  type Runtime,
  storeSnapshot,
  streamTimer,
  timingHeader,
} from "../../lib/serve/mod.ts";
import {
  clientSignal,
  createBaseApp,
  deadlineTier,
  HttpError,
  keyTenant,
  messagesSchema,
  peerHeaders,
  readJson,
  requestContext,
  samplingFields,
  SNAPSHOT_TYPE,
  tokenIdsSchema,
} from "../shared/mod.ts";

const decodeParams = z.object({
  tier: z.string().min(1).optional(),
  continuation: z.string().optional(),
  stream: z.boolean().optional(),
  ...samplingFields,
});

const prefillSchema = z.object({
  tier: z.string().min(1),
  prompt: z.string().min(1).optional(),
  messages: messagesSchema.optional(),
  tokens: tokenIdsSchema.optional(),
  store: z.boolean().default(false),
  forward_to: z.string().min(1).optional(),
  /** Isolates this request's prefix-cache entries further within its tenant (as vLLM's). */
  cache_salt: z.string().min(1).max(256).optional(),
  decode: decodeParams.default({}),
}).refine((b) => [b.prompt, b.messages, b.tokens].filter((x) => x !== undefined).length === 1, {
  message: "give exactly one of prompt, messages, tokens",
  path: ["prompt"],
}).refine((b) => !(b.store && b.forward_to), {
  message: "store and forward_to are exclusive",
  path: ["forward_to"],
});

/** Query string of a decode call carrying a snapshot body. */
function decodeQuery(tier: string, p: z.infer<typeof decodeParams>): string {
  const q = new URLSearchParams({ tier: p.tier ?? tier });
  for (
    const k of [
      "max_tokens",
      "temperature",
      "top_p",
      "top_k",
      "min_p",
      "seed",
      "continuation",
      "stream",
    ] as const
  ) {
    const v = p[k];
    if (v !== undefined) q.set(k, String(v));
  }
  if (p.stop != null) q.set("stop", JSON.stringify(typeof p.stop === "string" ? [p.stop] : p.stop));
  return q.toString();
}

/**
 * Registers POST /v1/prefill.
 * @param app the app (from createBaseApp)
 * @param rt the runtime
 */
export function registerPrefill(app: Hono, rt: Runtime): void {
  app.post("/v1/prefill", async (c) => {
    // The tier's deadline counts from the request's arrival (its body's upload included).
    const started = c.get("arrivalMs") ?? performance.now();
    const body = prefillSchema.parse(await readJson(c, rt));
    const tier = requireTier(rt, body.tier);
    deadlineTier(c, tier);
    let peer: string | undefined;
    if (body.forward_to !== undefined) {
      // Own keys only: a name like "constructor" must not find Object.prototype's members.
      peer = Object.hasOwn(rt.config.peers, body.forward_to)
        ? rt.config.peers[body.forward_to]
        : undefined;
      if (!peer) {
        throw new NotFoundError(
          `unknown peer "${body.forward_to}"; configured: ${
            Object.keys(rt.config.peers).join(", ") || "none"
          }`,
          "forward_to",
        );
      }
    }
    const field = body.tokens ? "tokens" : body.messages ? "messages" : "prompt";
    const ids = await promptIds(
      tier,
      { ids: body.tokens, text: body.prompt, messages: body.messages },
      field,
    );
    const stream = await prefillSnapshot(
      rt,
      tier,
      ids,
      field,
      requestContext(c, { cacheSalt: body.cache_salt }),
    );

    if (body.store) {
      const { id, bytes } = await storeSnapshot(rt, keyTenant(c), stream);
      return c.json({ snapshot_id: id, tier: tier.name, tokens: ids.length, bytes });
    }
    if (peer !== undefined) {
      // The peer call is bounded by this tier's request deadline too: a peer host that vanishes
      // (no RST, no answer) must not hold the client, the sequence and the slot until TCP gives up.
      const left = tier.config.request_timeout_ms - (performance.now() - started);
      const deadline = AbortSignal.timeout(Math.max(1, Math.round(left)));
      const timer = streamTimer();
      let res: Response;
      try {
        res = await fetch(
          `${peer.replace(/\/$/, "")}/v1/decode?${decodeQuery(tier.name, body.decode)}`,
          {
            method: "POST",
            headers: { "content-type": SNAPSHOT_TYPE, ...peerHeaders(rt) },
            body: stream.pipeThrough(timer.transform),
            signal: AbortSignal.any([clientSignal(c), deadline]),
          },
        );
      } catch (e) {
        await stream.cancel().catch(() => {});
        const why = deadline.aborted
          ? `no answer within the request deadline (${tier.config.request_timeout_ms} ms)`
          : `is unreachable: ${(e as Error).message}`;
        throw new HttpError(
          503,
          "peer_unavailable_error",
          `peer "${body.forward_to}" at ${peer} ${why}`,
        );
      }
      const headers = new Headers({
        "content-type": res.headers.get("content-type") ?? "application/json",
      });
      headers.set("x-kvrelay-handoff", `${tier.name}->${body.forward_to}`);
      // Streaming evidence: when this side encoded the snapshot and when the peer imported it.
      const exported = timingHeader(timer.timing);
      if (exported !== null) headers.set("x-kvrelay-export-ms", exported);
      const imported = res.headers.get("x-kvrelay-import-ms");
      if (imported !== null) headers.set("x-kvrelay-import-ms", imported);
      return new Response(res.body, { status: res.status, headers });
    }
    return new Response(stream, {
      status: 200,
      headers: {
        "content-type": SNAPSHOT_TYPE,
        "x-kvrelay-tier": tier.name,
        "x-kvrelay-tokens": String(ids.length),
      },
    });
  });
}

/**
 * Builds the prefill function's app alone.
 * @param rt the runtime
 * @returns the Hono app
 */
export function createPrefillApp(rt: Runtime): Hono {
  const app = createBaseApp(rt, "prefill");
  registerPrefill(app, rt);
  return app;
}
