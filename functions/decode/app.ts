// The decode function: POST /v1/decode continues generation from a KV snapshot — the snapshot as
// the body (application/vnd.kvrelay.snapshot, streamed into the import; parameters in the query)
// or by id from the shared store (JSON body) — with optional continuation text, sampling, and
// SSE when streaming. A snapshot of another tier's model is migrated into the requested tier
// when the projector gate allows (else 422); one of a model no tier serves is a 409.
import type { Context, Hono } from "hono";
import { z } from "zod";
import type { SnapshotHeader } from "../../lib/snapshot/mod.ts";
import {
  abortError,
  checkTextBound,
  decodeOrigin,
  InputError,
  loadStored,
  peekHeader,
  receiveUpload,
  type RequestContext,
  requireReady,
  requireTier,
  type Runtime,
  type ServedResult,
  startFromSnapshot,
  streamTimer,
  type StreamTiming,
  type Tier,
  tierOfSnapshot,
  timingHeader,
} from "../../lib/serve/mod.ts";
import {
  blameSnapshot,
  createBaseApp,
  deadlineTier,
  errorBody,
  generationOptions,
  keyTenant,
  readJson,
  requestBody,
  requestContext,
  samplingFields,
  snapshotOrJson,
  sseResponse,
  strictQuery,
} from "../shared/mod.ts";

const decodeJsonSchema = z.object({
  snapshot_id: z.string().min(1),
  tier: z.string().min(1).optional(),
  continuation: z.string().optional(),
  stream: z.boolean().optional(),
  ...samplingFields,
});

const num = (int: boolean) =>
  z.string().regex(
    int ? /^\d+$/ : /^-?\d+(\.\d+)?$/,
    int ? "must be a whole number, e.g. 16" : "must be a decimal number, e.g. 0.7",
  ).transform(Number);

const decodeQuerySchema = z.object({
  tier: z.string().min(1).optional(),
  continuation: z.string().optional(),
  stream: z.enum(["true", "false"]).transform((s) => s === "true").optional(),
  max_tokens: num(true).pipe(z.number().int().min(1)).optional(),
  temperature: num(false).pipe(z.number().min(0).max(2)).optional(),
  top_p: num(false).pipe(z.number().gt(0).max(1)).optional(),
  top_k: num(true).pipe(z.number().int().min(0)).optional(),
  min_p: num(false).pipe(z.number().min(0).max(1)).optional(),
  repetition_penalty: num(false).pipe(z.number().gt(0)).optional(),
  min_tokens: num(true).pipe(z.number().int().min(0)).optional(),
  ignore_eos: z.enum(["true", "false"]).transform((s) => s === "true").optional(),
  seed: num(true).pipe(z.number().int().min(0).max(2 ** 32 - 1)).optional(),
  stop: z.string().transform((s, ctx) => {
    try {
      const v = JSON.parse(s);
      if (Array.isArray(v) && v.every((x) => typeof x === "string" && x.length > 0)) {
        return v as string[];
      }
    } catch {
      // fall through
    }
    ctx.addIssue({ code: "custom", message: "stop must be a JSON array of non-empty strings" });
    return z.NEVER;
  }).optional(),
});

function finishReason(r: ServedResult): "stop" | "length" {
  return r.finishReason === "stop" ? "stop" : "length";
}

async function respond(
  c: Context,
  rt: Runtime,
  tier: Tier,
  source: Tier,
  input: Uint8Array | ReadableStream<Uint8Array>,
  header: SnapshotHeader,
  p: z.infer<typeof decodeJsonSchema> | z.infer<typeof decodeQuerySchema>,
  importTiming?: StreamTiming,
): Promise<Response> {
  deadlineTier(c, tier);
  const options = generationOptions(tier, p);
  if (p.continuation) checkTextBound(tier, p.continuation.length, "continuation");
  const continuationIds = p.continuation
    ? await tier.model.tokenizer.encodeAsync(p.continuation)
    : [];
  const ac = new AbortController();
  const ctx: RequestContext = requestContext(c, {
    signal: AbortSignal.any([c.req.raw.signal, ac.signal]),
  });
  const gen = await startFromSnapshot(rt, {
    tier,
    source,
    input,
    header,
    continuationIds,
    options,
    ctx,
  });
  // When a streamed snapshot's bytes were read by the import (the import has finished here).
  const imported = importTiming ? timingHeader(importTiming) : null;
  if (imported !== null) c.header("x-kvrelay-import-ms", imported);
  // Provenance: from the snapshot's header (a /v1/migrate output says where its KV came from)
  // and from what this decode did; why a handoff carried no KV is a stable code.
  const origin = decodeOrigin(rt, header, source, gen.cache);
  if (origin.reason) c.header("x-kvrelay-migration-reason", origin.reason);
  const snapshotTokens = gen.promptIds.length - continuationIds.length;
  const base = {
    tier: tier.name,
    snapshot_tokens: snapshotTokens,
    migrated: origin.migrated,
    source_tier: origin.sourceTier,
    migration_reason: origin.reason,
    reused_tokens: gen.cache.reusedTokens,
    repair_tokens: Math.max(0, snapshotTokens - gen.cache.reusedTokens),
  };
  if (!p.stream) {
    const r = await gen.collect();
    return c.json({
      ...base,
      text: r.text,
      finish_reason: finishReason(r),
      ttft_ms: r.ttftMs,
      usage: {
        prompt_tokens: r.promptTokens,
        completion_tokens: r.tokenIds.length,
        total_tokens: r.promptTokens + r.tokenIds.length,
      },
    });
  }
  return sseResponse(
    c,
    async (send) => {
      const it = gen.tokens();
      let step = await it.next();
      while (!step.done) {
        if (step.value.text !== "") send({ text: step.value.text });
        step = await it.next();
      }
      const r = step.value;
      if (r.abortCause) throw abortError(r, gen);
      send({
        ...base,
        text: "",
        finish_reason: finishReason(r),
        usage: {
          prompt_tokens: r.promptTokens,
          completion_tokens: r.tokenIds.length,
          total_tokens: r.promptTokens + r.tokenIds.length,
        },
      });
    },
    () => ac.abort(),
    (e) => errorBody(e, c.get("requestId")).body,
  );
}

/**
 * Registers POST /v1/decode.
 * @param app the app (from createBaseApp)
 * @param rt the runtime
 */
export function registerDecode(app: Hono, rt: Runtime): void {
  app.post("/v1/decode", async (c, next) => {
    if (!snapshotOrJson(c)) return await next();
    const q = decodeQuerySchema.parse(strictQuery(c));
    const target = q.tier === undefined ? undefined : requireTier(rt, q.tier);
    requireReady(rt);
    const body = requestBody(c);
    if (!body) throw new InputError("snapshot body is empty", "body");
    let release = () => {};
    try {
      // Received whole (checked as it arrives, each byte charged to the body budget, within the
      // body deadline) before the request may take a tier slot: a slow upload holds the memory
      // it has sent, never the engine.
      // The timer records when the snapshot's first and last bytes arrived.
      const timer = streamTimer();
      const up = await receiveUpload(rt, body.pipeThrough(timer.transform), {
        client: c.req.raw.signal,
        arrivalMs: c.get("arrivalMs"),
      }, target);
      release = up.release;
      const source = tierOfSnapshot(rt, up.header, target);
      return await respond(
        c,
        rt,
        target ?? source,
        source,
        up.replay(),
        up.header,
        q,
        timer.timing,
      );
    } catch (e) {
      throw blameSnapshot(e, { snapshot: "body", tier: "tier" });
    } finally {
      // The import has finished (or failed) by now: the buffered bytes are no longer needed.
      release();
    }
  }, async (c) => {
    const body = decodeJsonSchema.parse(await readJson(c, rt));
    requireReady(rt);
    const bytes = await loadStored(rt, keyTenant(c), body.snapshot_id);
    const target = body.tier !== undefined ? requireTier(rt, body.tier) : undefined;
    try {
      const header = peekHeader(bytes);
      const source = tierOfSnapshot(rt, header, target);
      return await respond(c, rt, target ?? source, source, bytes, header, body);
    } catch (e) {
      throw blameSnapshot(e, { snapshot: "snapshot_id", tier: "tier" });
    }
  });
}

/**
 * Builds the decode function's app alone.
 * @param rt the runtime
 * @returns the Hono app
 */
export function createDecodeApp(rt: Runtime): Hono {
  const app = createBaseApp(rt, "decode");
  registerDecode(app, rt);
  return app;
}
