// The migrate function: POST /v1/migrate turns a snapshot of one tier's model into a snapshot of
// another tier's model — exact copy for the same model, else through the configured projector
// when its quality gate allows (422 otherwise). The last `repair` tokens leave the KV and ride as
// pending tokens, so the target recomputes them itself on import. Snapshot body (query: target,
// store) or JSON {snapshot_id, target, store}; answers the target snapshot or {snapshot_id}.
import type { Context, Hono } from "hono";
import { z } from "zod";
import type { NativeSequence } from "../../lib/native/mod.ts";
import { exportSnapshotStream, importSnapshot } from "../../lib/snapshot/mod.ts";
import { clientSignal, createBaseApp, jsonBodyLimit, requireTier } from "../shared/app.ts";
import { blameSnapshot, HttpError, readJsonBody } from "../shared/errors.ts";
import {
  countBytes,
  isSnapshotBody,
  loadStored,
  peekHeader,
  readBounded,
  releaser,
  requestBody,
  SNAPSHOT_TYPE,
  snapshotKey,
  streamThenFree,
} from "../shared/handoff.ts";
import { MigrationRefusedError } from "../shared/migration.ts";
import { admitSlot } from "../shared/generation.ts";
import type { Runtime } from "../shared/runtime.ts";
import { tierOfSnapshot } from "../shared/handoff.ts";

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
  bytes: Uint8Array,
  targetName: string,
  store: boolean,
): Promise<Response> {
  if (!rt.ready) throw new HttpError(503, "unavailable_error", "server is not ready");
  const target = requireTier(rt, targetName, "target");
  const source = tierOfSnapshot(rt, peekHeader(bytes));
  const gate = rt.migrator.gate(source, target);
  if (!gate.ok) {
    throw new MigrationRefusedError(
      "no_projector",
      `${source.name} → ${target.name}: ${gate.reason}`,
    );
  }
  const { release } = await admitSlot(rt, target, clientSignal(c));
  rt.metrics.activeSequences.add({ tier: target.name }, 1);
  let src: NativeSequence | null = null;
  let tgt: NativeSequence | null = null;
  let done = releaser(rt, target, null, release);
  try {
    const imported = await importSnapshot(source.model, bytes, {
      verify: rt.verify,
      maxBytes: rt.config.server.max_snapshot_bytes,
      reserve: 0,
      maxTokens: source.config.max_context,
      prefillPending: false,
    });
    src = imported.sequence;
    const kvTokens = imported.header.tokenIds.length;
    const same = source.model.fingerprint === target.model.fingerprint;
    const keep = same ? kvTokens : Math.max(0, kvTokens - gate.repairTokens);
    tgt = target.model.native.createSequence(Math.max(1, keep));
    done = releaser(rt, target, tgt, release);
    if (keep > 0) await rt.migrator.projectInto(source, target, src, keep, tgt);
    src.free();
    src = null;
    if (!same) rt.metrics.migrations.inc({ from: source.name, to: target.name });
    const ids = imported.tokenIds;
    const stream = streamThenFree(
      exportSnapshotStream(target.model, tgt, {
        tokens: ids.slice(0, keep),
        pending: ids.slice(keep),
        encoding: target.encoding,
        sign: rt.sign,
      }),
      done,
    ).pipeThrough(countBytes(rt, "out"));
    const headers = {
      "x-kvrelay-source-tier": source.name,
      "x-kvrelay-tier": target.name,
      "x-kvrelay-migrated-tokens": String(keep),
      "x-kvrelay-repair-tokens": String(ids.length - keep),
    };
    if (store) {
      const out = new Uint8Array(await new Response(stream).arrayBuffer());
      const id = crypto.randomUUID();
      await rt.store.put(
        snapshotKey(id),
        out,
        rt.config.store.ttl_ms ? { ttlMs: rt.config.store.ttl_ms } : {},
      );
      return c.json({
        snapshot_id: id,
        source_tier: source.name,
        tier: target.name,
        migrated_tokens: keep,
        repair_tokens: ids.length - keep,
        bytes: out.length,
      });
    }
    return new Response(stream, {
      status: 200,
      headers: { "content-type": SNAPSHOT_TYPE, ...headers },
    });
  } catch (e) {
    src?.free();
    done();
    throw e;
  }
}

/**
 * Registers POST /v1/migrate.
 * @param app the app (from createBaseApp)
 * @param rt the runtime
 */
export function registerMigrate(app: Hono, rt: Runtime): void {
  const limit = jsonBodyLimit(rt.config.server.max_body_bytes);
  app.post("/v1/migrate", async (c, next) => {
    if (!isSnapshotBody(c)) return await limit(c, next);
    const q = querySchema.parse(c.req.query());
    const bytes = await readBounded(requestBody(c), rt.config.server.max_snapshot_bytes);
    rt.metrics.snapshotBytes.inc({ direction: "in" }, bytes.length);
    try {
      return await migrate(c, rt, bytes, q.target, q.store);
    } catch (e) {
      throw blameSnapshot(e, { snapshot: "body", tier: "target" });
    }
  }, async (c) => {
    const body = jsonSchema.parse(await readJsonBody(c));
    if (!rt.ready) throw new HttpError(503, "unavailable_error", "server is not ready");
    const bytes = await loadStored(rt, body.snapshot_id);
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
