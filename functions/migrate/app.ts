// The migrate function: POST /v1/migrate turns a snapshot of one tier's model into a snapshot of
// another tier's model — exact copy for the same model, else through the configured projector
// when its quality gate allows (422 otherwise). The last `repair` tokens leave the KV and ride as
// pending tokens, so the target recomputes them itself on import. Snapshot body (query: target,
// store) or JSON {snapshot_id, target, store}; answers the target snapshot or {snapshot_id}.
import type { Context, Hono } from "hono";
import { z } from "zod";
import {
  InputError,
  loadStored,
  migrateSnapshot,
  receiveUpload,
  requireReady,
  type Runtime,
  storeSnapshot,
  type Upload,
} from "../../lib/serve/mod.ts";
import {
  blameSnapshot,
  createBaseApp,
  keyTenant,
  readJson,
  requestBody,
  requestContext,
  SNAPSHOT_TYPE,
  snapshotOrJson,
  strictQuery,
} from "../shared/mod.ts";

const jsonSchema = z.object({
  snapshot_id: z.string().min(1),
  target: z.string().min(1),
  store: z.boolean().default(false),
});

const querySchema = z.object({
  target: z.string().min(1),
  store: z.enum(["true", "false"]).transform((s) => s === "true").default(false),
});

async function migrate(
  c: Context,
  rt: Runtime,
  input: Uint8Array | Upload,
  targetName: string,
  store: boolean,
): Promise<Response> {
  const m = await migrateSnapshot(rt, input, targetName, "target", requestContext(c));
  if (store) {
    const { id, bytes: n } = await storeSnapshot(rt, keyTenant(c), m.stream);
    return c.json({
      snapshot_id: id,
      source_tier: m.source.name,
      tier: m.target.name,
      migrated_tokens: m.migratedTokens,
      repair_tokens: m.repairTokens,
      migration_reason: m.emptyReason,
      bytes: n,
    });
  }
  return new Response(m.stream, {
    status: 200,
    headers: {
      "content-type": SNAPSHOT_TYPE,
      "x-kvrelay-source-tier": m.source.name,
      "x-kvrelay-tier": m.target.name,
      "x-kvrelay-migrated-tokens": String(m.migratedTokens),
      "x-kvrelay-repair-tokens": String(m.repairTokens),
      ...(m.emptyReason ? { "x-kvrelay-migration-reason": m.emptyReason } : {}),
    },
  });
}

/**
 * Registers POST /v1/migrate.
 * @param app the app (from createBaseApp)
 * @param rt the runtime
 */
export function registerMigrate(app: Hono, rt: Runtime): void {
  app.post("/v1/migrate", async (c, next) => {
    if (!snapshotOrJson(c)) return await next();
    const q = querySchema.parse(strictQuery(c));
    requireReady(rt);
    const body = requestBody(c);
    if (!body) throw new InputError("snapshot body is empty", "body");
    let release = () => {};
    try {
      // Checked as bytes arrive (a hostile body is refused at its first bad byte), each byte
      // charged to the process's body budget, received whole before taking a slot; the target
      // tier's request deadline caps the body deadline.
      const target = Object.hasOwn(rt.config.tiers, q.target)
        ? { name: q.target, config: rt.config.tiers[q.target] }
        : undefined;
      const up = await receiveUpload(rt, body, {
        client: c.req.raw.signal,
        arrivalMs: c.get("arrivalMs"),
      }, target);
      release = up.release;
      return await migrate(c, rt, up, q.target, q.store);
    } catch (e) {
      throw blameSnapshot(e, { snapshot: "body", tier: "target" });
    } finally {
      release();
    }
  }, async (c) => {
    const body = jsonSchema.parse(await readJson(c, rt));
    requireReady(rt);
    const bytes = await loadStored(rt, keyTenant(c), body.snapshot_id);
    try {
      return await migrate(c, rt, bytes, body.target, body.store);
    } catch (e) {
      throw blameSnapshot(e, { snapshot: "snapshot_id", tier: "target" });
    }
  });
}

/**
 * Builds the migrate function's app alone.
 * @param rt the runtime
 * @returns the Hono app
 */
export function createMigrateApp(rt: Runtime): Hono {
  const app = createBaseApp(rt, "migrate");
  registerMigrate(app, rt);
  return app;
}
