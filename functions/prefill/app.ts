// The prefill function: POST /v1/prefill {tier, prompt | messages | tokens, store?, forward_to?}
// prefills all prompt tokens but the last (reusing the tier's prefix cache) and answers with the
// KV snapshot (streamed, HMAC-signed when a key is configured; the last token rides as pending so
// the importer computes the next-token logits itself), or stores it ({snapshot_id}), or streams
// it to a peer decode function and relays that answer (cross-process handoff).
import type { Hono } from "hono";
import { z } from "zod";
import { exportSnapshotStream } from "../../lib/snapshot/mod.ts";
import { prefillWithCache } from "../../lib/store/prefix_cache.ts";
import type { NativeSequence } from "../../lib/native/mod.ts";
import {
  clientSignal,
  createBaseApp,
  jsonBodyLimit,
  peerHeaders,
  requireTier,
} from "../shared/app.ts";
import { HttpError, readJsonBody } from "../shared/errors.ts";
import {
  countBytes,
  releaser,
  SNAPSHOT_TYPE,
  snapshotKey,
  streamThenFree,
} from "../shared/handoff.ts";
import { admitSlot } from "../shared/generation.ts";
import type { Runtime } from "../shared/runtime.ts";
import { messagesSchema, promptIds, samplingFields, tokenIdsSchema } from "../shared/schemas.ts";

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
  app.post("/v1/prefill", jsonBodyLimit(rt.config.server.max_body_bytes), async (c) => {
    const body = prefillSchema.parse(await readJsonBody(c));
    const tier = requireTier(rt, body.tier);
    let peer: string | undefined;
    if (body.forward_to !== undefined) {
      // Own keys only: a name like "constructor" must not find Object.prototype's members.
      peer = Object.hasOwn(rt.config.peers, body.forward_to)
        ? rt.config.peers[body.forward_to]
        : undefined;
      if (!peer) {
        throw new HttpError(
          404,
          "not_found_error",
          `unknown peer "${body.forward_to}"; configured: ${
            Object.keys(rt.config.peers).join(", ") || "none"
          }`,
          "forward_to",
        );
      }
    }
    const field = body.tokens ? "tokens" : body.messages ? "messages" : "prompt";
    const ids = promptIds(
      tier,
      { ids: body.tokens, text: body.prompt, messages: body.messages },
      field,
    );
    if (ids.length >= tier.config.max_context) {
      throw new HttpError(
        400,
        "context_length_exceeded",
        `prompt (${ids.length} tokens) reaches max_context ${tier.config.max_context}`,
        field,
      );
    }

    const { release } = await admitSlot(rt, tier, clientSignal(c));
    rt.metrics.activeSequences.add({ tier: tier.name }, 1);
    let seq: NativeSequence | null = null;
    let done = releaser(rt, tier, null, release);
    let stream: ReadableStream<Uint8Array>;
    const kv = ids.slice(0, -1);
    try {
      seq = tier.model.native.createSequence(Math.max(1, kv.length));
      done = releaser(rt, tier, seq, release);
      if (kv.length > 0) {
        if (tier.prefix) {
          const r = await prefillWithCache(tier.prefix, seq, kv);
          if (r.reusedTokens > 0) {
            rt.metrics.prefixHits.inc({ tier: tier.name });
            rt.metrics.reusedTokens.inc({ tier: tier.name }, r.reusedTokens);
          } else if (kv.length > tier.prefix.chunkTokens) {
            rt.metrics.prefixMisses.inc({ tier: tier.name });
          }
        } else await seq.prefill(kv);
      }
      stream = streamThenFree(
        exportSnapshotStream(tier.model, seq, {
          tokens: kv,
          pending: ids.slice(-1),
          encoding: tier.encoding,
          sign: rt.sign,
        }),
        done,
      ).pipeThrough(countBytes(rt, "out"));
    } catch (e) {
      done();
      throw e;
    }

    if (body.store) {
      const bytes = new Uint8Array(await new Response(stream).arrayBuffer());
      const id = crypto.randomUUID();
      await rt.store.put(
        snapshotKey(id),
        bytes,
        rt.config.store.ttl_ms ? { ttlMs: rt.config.store.ttl_ms } : {},
      );
      return c.json({ snapshot_id: id, tier: tier.name, tokens: ids.length, bytes: bytes.length });
    }
    if (peer !== undefined) {
      let res: Response;
      try {
        res = await fetch(
          `${peer.replace(/\/$/, "")}/v1/decode?${decodeQuery(tier.name, body.decode)}`,
          {
            method: "POST",
            headers: { "content-type": SNAPSHOT_TYPE, ...peerHeaders(rt) },
            body: stream,
            signal: clientSignal(c),
          },
        );
      } catch (e) {
        await stream.cancel().catch(() => {});
        throw new HttpError(
          503,
          "peer_unavailable_error",
          `peer "${body.forward_to}" at ${peer} is unreachable: ${(e as Error).message}`,
        );
      }
      const headers = new Headers({
        "content-type": res.headers.get("content-type") ?? "application/json",
      });
      headers.set("x-kvrelay-handoff", `${tier.name}->${body.forward_to}`);
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
