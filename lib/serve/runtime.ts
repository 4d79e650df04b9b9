// The process-wide state every function app is built from: the config, loaded tiers (model +
// bounded queue + prefix cache), the snapshot store, signing keys, the router, the migrator and
// the metrics. Built once per process (createRuntime + load) and injected into the Hono apps.
// It loads and frees; request handling lives in generation.ts and the function apps.
import type { KvrelayConfig } from "../config/mod.ts";
import { type LoadedModel, loadModel, type LoadTimings } from "../engine/mod.ts";
import type { NativeModelOptions } from "../native/mod.ts";
import type { KeyRing } from "../snapshot/mod.ts";
import {
  createRedisStore,
  FsStore,
  MemoryStore,
  PrefixCache,
  type SnapshotStore,
} from "../store/mod.ts";
import { Router } from "../router/mod.ts";
import { UnavailableError } from "./errors.ts";
import { Metrics } from "./metrics.ts";
import { ModelQueue } from "./queue.ts";
import { BodyBudget } from "./uploads.ts";
import { createMigrator, type Migrator } from "./migrator.ts";
import { findTier, type Tier } from "./tier.ts";
import { autoFallbackNote, resolveTierBackends } from "./backends.ts";
import { createBatching } from "./batching.ts";

/** Load state of one tier. */
export interface TierLoadState {
  state: "loading" | "ready" | "failed";
  /** Where its load's time went (once loaded). */
  loadMs?: LoadTimings;
}

/**
 * Where a process's start went. Times are ms since the runtime's time origin (process start,
 * `performance.now()`); the serving process fills in `modulesMs` and `listeningMs`.
 */
export interface StartupReport {
  /** The time origin as wall-clock epoch ms (to compare with when the process was spawned). */
  timeOriginEpochMs: number;
  /** Every module evaluated: the entry point started running. */
  modulesMs: number | null;
  /** The HTTP server listens (/healthz answers). */
  listeningMs: number | null;
  /** Tier loads started. */
  loadStartedMs: number | null;
  /** Per tier, in config order. */
  tiers: Record<string, TierLoadState>;
  /** Time spent loading the projectors (after the tiers). */
  projectorsMs: number | null;
  /** Every tier and projector loaded. */
  readyMs: number | null;
}

/** Everything the function apps need; see {@link createRuntime}. */
export interface Runtime {
  config: KvrelayConfig;
  /** Loaded tiers by name (empty until {@link Runtime.load} finished). */
  tiers: Map<string, Tier>;
  store: SnapshotStore;
  metrics: Metrics;
  /** Bytes of request bodies held at once, charged as they arrive
   *  (server.max_inflight_upload_bytes). */
  uploads: BodyBudget;
  router: Router;
  migrator: Migrator;
  /** Signing key for exported snapshots, when configured. */
  sign: { keyId: string; key: Uint8Array } | undefined;
  /** Verification keys for imported snapshots, when configured. */
  verify: { keys: KeyRing; required: boolean } | undefined;
  /** True once every tier is loaded and until shutdown starts. */
  readonly ready: boolean;
  /** True once shutdown started. */
  readonly draining: boolean;
  /** Where the start's time went, and which tiers are loaded (for /readyz). */
  readonly startup: StartupReport;
  /** Aborted when the shutdown grace period ends: in-flight generations stop. */
  readonly shutdownSignal: AbortSignal;
  /** Loads every tier's model (idempotent). @throws Error when a model fails to load */
  load(): Promise<void>;
  /** Marks the runtime draining (readyz answers 503). */
  startDrain(): void;
  /** Stops in-flight generations at their next token (shutdown grace period over). */
  abortInFlight(): void;
  /** Aborts in-flight generations, frees models, closes the store. */
  close(): Promise<void>;
}

/** Options of {@link createRuntime}. */
export interface RuntimeOptions {
  /** Overrides the store built from the config. */
  store?: SnapshotStore;
  /** Overrides per-tier native options (e.g. a test library). */
  native?: NativeModelOptions;
}

async function openStore(config: KvrelayConfig): Promise<SnapshotStore> {
  const s = config.store;
  if (s.kind === "memory") {
    return new MemoryStore({ maxBytes: s.max_bytes, defaultTtlMs: s.ttl_ms });
  }
  if (s.kind === "fs") {
    return await FsStore.open(s.dir, { maxBytes: s.max_bytes, defaultTtlMs: s.ttl_ms });
  }
  return await createRedisStore({
    url: config.secrets.redisUrl ?? undefined,
    keyPrefix: s.key_prefix,
    defaultTtlMs: s.ttl_ms,
    maxBytes: s.max_bytes,
  });
}

/**
 * Builds a runtime from a config: opens the store, the router and the metrics. Models are
 * loaded by `load()` so a server can answer /healthz (and 503 on /readyz) meanwhile.
 * @param config a ready config (lib/config)
 * @param opts store or native overrides
 * @returns the runtime, not yet loaded
 * @throws {StoreError} when the store cannot be opened
 */
export async function createRuntime(
  config: KvrelayConfig,
  opts: RuntimeOptions = {},
): Promise<Runtime> {
  const store = opts.store ?? await openStore(config);
  const metrics = new Metrics();
  metrics.inflightBodyBytes.set({}, 0);
  const router = new Router({
    tiers: config.tierOrder,
    defaultTier: config.defaultTier,
    rules: config.router.rules,
    sticky: config.router.sticky_escalation,
  });
  const tiers = new Map<string, Tier>();
  const shutdown = new AbortController();
  const key = config.secrets.snapshotKey;
  let ready = false;
  let draining = false;
  let loading: Promise<void> | null = null;
  const startup: StartupReport = {
    timeOriginEpochMs: performance.timeOrigin,
    modulesMs: null,
    listeningMs: null,
    loadStartedMs: null,
    tiers: Object.fromEntries(config.tierOrder.map((n) => [n, { state: "loading" }])),
    projectorsMs: null,
    readyMs: null,
  };
  const rt: Runtime = {
    config,
    tiers,
    store,
    metrics,
    uploads: new BodyBudget(
      config.server.max_inflight_upload_bytes,
      "server.max_inflight_upload_bytes",
      (used) => metrics.inflightBodyBytes.set({}, used),
    ),
    router,
    migrator: createMigrator(config),
    sign: key ? { keyId: config.auth.snapshot_key_id, key } : undefined,
    verify: key
      ? {
        keys: new Map([[config.auth.snapshot_key_id, key]]),
        required: config.auth.require_signed_snapshots,
      }
      : undefined,
    get ready() {
      return ready && !draining;
    },
    get draining() {
      return draining;
    },
    shutdownSignal: shutdown.signal,
    startup,
    load() {
      loading ??= (async () => {
        // Unset → a random secret of this process: prefix keys are unguessable, and only this
        // process can hit its own entries (configure the secret to share across processes).
        const salt = config.secrets.tenantSalt ?? crypto.getRandomValues(new Uint8Array(32));
        const backends = resolveTierBackends(config, opts.native?.lib);
        const note = autoFallbackNote(backends);
        if (note !== null) console.error(`kvrelay: ${note}`);
        startup.loadStartedMs = performance.now();
        // Tiers load concurrently: each native load runs on a worker thread (loadModel), so one
        // tier's weights are packed while the next tier's checkpoint and tokenizer are read.
        const loads = await Promise.allSettled(config.tierOrder.map(async (name) => {
          const tc = config.tiers[name];
          const be = backends.get(name)!;
          try {
            const model = await loadModel(tc.model, {
              ...opts.native,
              kvDtype: tc.kv_dtype,
              threads: tc.threads,
              weights: tc.weights,
              backend: be.backend,
              device: be.device,
            });
            startup.tiers[name] = { state: "ready", loadMs: model.loadMs };
            return model;
          } catch (e) {
            startup.tiers[name] = { state: "failed" };
            throw e;
          }
        }));
        const failed = loads.find((l) => l.status === "rejected");
        if (failed) {
          for (const l of loads) if (l.status === "fulfilled") l.value.native.free();
          throw failed.reason;
        }
        const models = loads.map((l) => (l as PromiseFulfilledResult<LoadedModel>).value);
        for (const [rank, name] of config.tierOrder.entries()) {
          const tc = config.tiers[name];
          const model = models[rank];
          metrics.backendInfo.set({
            tier: name,
            backend: model.native.backend,
            device: String(model.native.device),
          }, 1);
          const queue = tc.batching
            ? null
            : new ModelQueue(name, tc.concurrency, tc.queue_depth, (_r, waiting) => {
              metrics.queueDepth.set({ tier: name }, waiting);
            });
          metrics.queueDepth.set({ tier: name }, 0);
          metrics.activeSequences.set({ tier: name }, 0);
          const encoding = tc.snapshot_encoding === "native" ? undefined : tc.snapshot_encoding;
          const prefix = config.prefix_cache.enabled
            ? new PrefixCache({
              store,
              model,
              tenantSalt: salt,
              chunkTokens: config.prefix_cache.chunk_tokens,
              ttlMs: config.prefix_cache.ttl_ms,
            })
            : null;
          const batch = tc.batching ? createBatching(name, tc, model.native, metrics) : null;
          tiers.set(name, { name, rank, config: tc, model, queue, prefix, encoding, batch });
        }
        const p0 = performance.now();
        await rt.migrator.load(tiers);
        startup.projectorsMs = performance.now() - p0;
        startup.readyMs = performance.now();
        ready = true;
      })();
      return loading;
    },
    startDrain() {
      draining = true;
    },
    abortInFlight() {
      draining = true;
      shutdown.abort(new Error("server shutting down"));
    },
    async close() {
      draining = true;
      shutdown.abort(new Error("server shutting down"));
      await rt.migrator.close();
      for (const t of tiers.values()) {
        t.batch?.scheduler.close();
        t.model.tokenizer.close();
        t.model.native.free();
      }
      tiers.clear();
      await store.close();
    },
  };
  return rt;
}

/**
 * A loaded tier by name, for a request (503 before the models are loaded).
 * @param rt the runtime
 * @param name the tier name
 * @param param request field that named it
 * @returns the tier
 * @throws {UnavailableError} not_ready before load finished or while draining;
 *   {@link NotFoundError} for an unknown name
 */
export function requireTier(rt: Runtime, name: string, param = "tier"): Tier {
  requireReady(rt);
  return findTier(rt.tiers, name, param);
}

/**
 * Refuses work before the runtime is ready (models loading) or once it drains.
 * @param rt the runtime
 * @throws {UnavailableError} shutting_down once draining (503 with Retry-After: retry elsewhere),
 *   not_ready before that
 */
export function requireReady(rt: Runtime): void {
  if (rt.draining) throw new UnavailableError("shutting_down", "server is shutting down");
  if (!rt.ready) throw new UnavailableError("not_ready", "server is not ready");
}
