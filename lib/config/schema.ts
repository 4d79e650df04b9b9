// The deployment config schema (zod): tiers, projectors between tiers, snapshot store, prefix
// cache, router rules, peers, auth and server limits. One JSON file per deployment; this file
// only declares shapes and defaults — reading files and the environment is load.ts.
import { z } from "zod";

const positiveInt = z.number().int().min(1);

/** A tier's sampling defaults: each field given overrides the model's generation_config.json;
 *  request fields override both. Nothing given anywhere: temperature 1, no filters, no penalty. */
export const samplingSchema = z.strictObject({
  /** 0 = greedy. */
  temperature: z.number().min(0).max(2).optional(),
  top_p: z.number().gt(0).max(1).optional(),
  /** 0 = off. */
  top_k: z.number().int().min(0).optional(),
  min_p: z.number().min(0).max(1).optional(),
  /** transformers'/vLLM's: > 0, 1 = off. */
  repetition_penalty: z.number().gt(0).optional(),
});

/** One tier: a model and how it is served. */
export const tierSchema = z.strictObject({
  /** Checkpoint directory; relative paths resolve against the config file's directory. */
  model: z.string().min(1),
  /** Compute backend: `auto` picks CUDA when its probe finds a usable device, else CPU (the
   *  reason is logged once); `cuda` without one refuses to start (exit 2). */
  backend: z.enum(["auto", "cpu", "cuda"]).default("auto"),
  /** CUDA device ordinal for `cuda`/`auto` (the CPU ignores it). */
  device: z.number().int().min(0).max(2147483647).default(0),
  /** Kernel worker threads (0 = all cores). */
  threads: z.number().int().min(0).max(1024).default(0),
  /** KV cache element type in memory. */
  kv_dtype: z.enum(["f32", "f16", "bf16"]).default("f32"),
  /** Linear weights in memory: `bf16` keeps the checkpoint's precision; `q8` quantizes them at
   *  load to 8 bits with per-32 block scales (CPU backend only; ~0.6× the bytes of bf16); `q4`
   *  to 4 bits with an f16 scale and offset per 32 (CPU only; ~0.3× the bytes of bf16). */
  weights: z.enum(["bf16", "q8", "q4"]).default("bf16"),
  /** Most tokens (prompt + generated) of one sequence. */
  max_context: positiveInt.max(32768).default(2048),
  /** Upper bound on max_tokens of one request. */
  max_new_tokens: positiveInt.max(32768).default(512),
  /** max_tokens when a request gives none. */
  default_max_tokens: positiveInt.max(32768).default(64),
  sampling: samplingSchema.default({}),
  /** Encoding of snapshots this tier exports (`native` = the cache's own dtype, lossless). */
  snapshot_encoding: z.enum(["native", "f32", "f16", "bf16", "q8", "q4"]).default("native"),
  /** Without batching: generations running at once on this tier's model (slots). With batching:
   *  only sizes the default KV pool (kv_pool_mb absent → room for this many max_context
   *  sequences); running requests are then bounded by the pool's blocks and max_batch. */
  concurrency: positiveInt.max(256).default(2),
  /** Requests allowed to wait (for a slot without batching; with batching, admitted requests not
   *  yet started: first row planned or blocks granted — at least one); one more is answered 429. */
  queue_depth: z.number().int().min(0).max(100000).default(16),
  /** Whole-request deadline in milliseconds (queue wait and wait for KV blocks included). */
  request_timeout_ms: positiveInt.default(60000),
  /** Continuous batching (docs/batching.md): generations share batched steps over a paged KV
   *  pool; false runs each generation alone with its own worst-case cache. */
  batching: z.boolean().default(true),
  /** Memory budget of the tier's paged KV pool, MiB (must hold one max_context sequence).
   *  Absent → derived from the model: `concurrency` sequences of max_context tokens
   *  (lib/serve/preflight.ts). */
  kv_pool_mb: z.number().gt(0).max(1048576).optional(),
  /** Positions per KV block (power of two). */
  kv_block_tokens: z.union([
    z.literal(8),
    z.literal(16),
    z.literal(32),
    z.literal(64),
    z.literal(128),
  ])
    .default(16),
  /** Most new tokens in one batched step (decodes count 1): bounds a prefill chunk, so a long
   *  prompt delays running decodes by at most one such step. */
  max_step_tokens: positiveInt.max(65536).default(256),
  /** Most sequences in one batched step. */
  max_batch: positiveInt.max(4096).default(64),
  /** Most decode steps one burst runs back to back when every waiting request is decoding
   *  (docs/batching.md "Bursts"); 1 turns bursts off. */
  max_decode_steps: positiveInt.max(64).default(8),
  /** A burst lasts about this long at most (ms, by the last decode step's time): bounds how long a
   *  new request waits for the next plan and how many tokens a stream gets at once. */
  decode_burst_ms: z.number().min(0).max(1000).default(4),
});

/** A projector from a lower tier's cache into a higher tier's cache, with its quality gate. */
export const projectorSchema = z.strictObject({
  from: z.string().min(1),
  to: z.string().min(1),
  /** Projector artifact directory (projector.json + weights.safetensors). */
  path: z.string().min(1),
  /** Migrate only when the projector's stored kl_recovered (at the repair length) is at least this. */
  min_quality: z.number().min(0).max(1).default(0.5),
  /** Prompt tokens the target recomputes itself after the migrated prefix (r ≥ 1); default:
   *  the projector's repair_default. Its quality must have been measured at this length. */
  repair_tokens: positiveInt.optional(),
});

/** Where snapshots and prefix-cache entries live. */
export const storeSchema = z.discriminatedUnion("kind", [
  z.strictObject({
    kind: z.literal("memory"),
    ttl_ms: positiveInt.optional(),
    max_bytes: positiveInt.default(256 * 1024 * 1024),
  }),
  z.strictObject({
    kind: z.literal("fs"),
    /** Directory; relative paths resolve against the config file's directory. */
    dir: z.string().min(1),
    ttl_ms: positiveInt.optional(),
    max_bytes: positiveInt.optional(),
  }),
  z.strictObject({
    kind: z.literal("redis"),
    /** Environment variable holding the redis URL (a secret: never in the file). */
    url_env: z.string().min(1).default("KVRELAY_REDIS_URL"),
    key_prefix: z.string().default("kvrelay:"),
    ttl_ms: positiveInt.optional(),
    max_bytes: positiveInt.optional(),
  }),
]);

/** One routing rule: all given conditions must hold; the first matching rule wins. */
export const routeRuleSchema = z.strictObject({
  tier: z.string().min(1),
  /** Prompt has at least this many tokens. */
  min_tokens: z.number().int().min(0).optional(),
  /** Prompt has at most this many tokens. */
  max_tokens: z.number().int().min(0).optional(),
  /** Prompt contains one of these words (case-insensitive, whole words). */
  keywords: z.array(z.string().min(1)).min(1).optional(),
});

/** How one deployment of this config runs on a serverless platform (read by `deno task deploy
 *  render`; the server itself ignores it). The served tier's concurrency, timeout and backend
 *  come from `tiers`, so manifests and server cannot disagree. */
export const deploySchema = z.strictObject({
  /** Service name on the platform (DNS label). */
  name: z.string().regex(/^[a-z]([-a-z0-9]{0,47}[a-z0-9])?$/),
  /** Entry point: functions/<function>/main.ts ("all" = functions/main.ts). */
  function: z.enum(["generate", "prefill", "migrate", "decode", "all"]),
  /** The tier this deployment serves (autoscaling target, request timeout). */
  tier: z.string().min(1),
  /** Image repository; tags `:cpu` and `:cuda` select the variant. */
  image: z.string().min(1).default("ghcr.io/kvrelay/kvrelay"),
  /** Fewest instances; 0 allows scale to zero. */
  min_scale: z.number().int().min(0).default(0),
  max_scale: z.number().int().min(1).max(1000).default(10),
  /** Seconds an idle instance is kept before scaling to zero. */
  scale_down_delay_s: z.number().int().min(0).max(3600).default(300),
  /** Platform secret holding the env variables the config names (auth, store, salt). */
  secret: z.string().regex(/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/).default("kvrelay"),
  /** CPU variant resources. */
  cpu: z.number().gt(0).max(64).default(2),
  memory_mib: z.number().int().min(256).default(2048),
  /** GPU variant resources (one GPU; every tier of the config runs `backend: cuda`). */
  gpu: z.strictObject({
    cpu: z.number().gt(0).max(64).default(4),
    memory_mib: z.number().int().min(1024).default(16384),
  }).default({ cpu: 4, memory_mib: 16384 }),
});

export const configSchema = z.strictObject({
  server: z.strictObject({
    port: z.number().int().min(0).max(65535).default(8080),
    host: z.string().min(1).default("0.0.0.0"),
    /** Largest JSON request body. */
    max_body_bytes: positiveInt.default(1 << 20),
    /** Largest snapshot accepted in a request body. */
    max_snapshot_bytes: positiveInt.default(256 * 1024 * 1024),
    /** On SIGTERM: in-flight requests get this long to finish; then connections are closed. */
    shutdown_grace_ms: z.number().int().min(0).default(10000),
    /** A request body (JSON or snapshot) must arrive completely within this many ms of the
     *  request's arrival, and within the tier's request_timeout_ms when that is shorter (else
     *  408). */
    body_timeout_ms: positiveInt.default(30000),
    /** Bytes of request bodies (JSON and snapshot uploads) held at once by this process,
     *  charged as they arrive; one more → 429. */
    max_inflight_upload_bytes: positiveInt.default(512 * 1024 * 1024),
    /** Origins allowed cross-origin (CORS); empty → no CORS headers (browsers refuse). */
    cors_origins: z.array(z.string().min(1)).default([]),
    /** Open client connections at most (one more → 503 and closed); absent → as many as the
     *  open-file limit allows (3 descriptors each, a reserve kept); lowered to that if above. */
    max_connections: positiveInt.optional(),
    /** A connection with no request in flight and no bytes either way for this long is closed. */
    idle_timeout_ms: positiveInt.default(30000),
    /** A request head must arrive within this long of its first byte, else 408 and closed. */
    head_timeout_ms: positiveInt.default(15000),
  }).default({
    port: 8080,
    host: "0.0.0.0",
    max_body_bytes: 1 << 20,
    max_snapshot_bytes: 256 * 1024 * 1024,
    shutdown_grace_ms: 10000,
    body_timeout_ms: 30000,
    max_inflight_upload_bytes: 512 * 1024 * 1024,
    cors_origins: [],
    idle_timeout_ms: 30000,
    head_timeout_ms: 15000,
  }),
  /** Tier name → tier, listed from lowest (cheapest) to highest. */
  tiers: z.record(z.string().regex(/^[A-Za-z0-9_.-]+$/), tierSchema).refine(
    (t) => Object.keys(t).length > 0,
    { message: "at least one tier is required" },
  ),
  /** Tier used when no rule matches and the request names none (default: the first tier). */
  default_tier: z.string().min(1).optional(),
  projectors: z.array(projectorSchema).default([]),
  store: storeSchema.default({ kind: "memory", max_bytes: 256 * 1024 * 1024 }),
  prefix_cache: z.strictObject({
    enabled: z.boolean().default(true),
    /** Tokens per cached chunk (prefix reuse granularity). */
    chunk_tokens: positiveInt.max(4096).default(16),
    ttl_ms: positiveInt.optional(),
    /** Environment variable with a per-deployment secret mixed into prefix keys (set it to share
     *  cached prefixes across processes; unset → a random secret per process). */
    tenant_salt_env: z.string().min(1).default("KVRELAY_TENANT_SALT"),
  }).default({ enabled: true, chunk_tokens: 16, tenant_salt_env: "KVRELAY_TENANT_SALT" }),
  router: z.strictObject({
    /** Ordered rules; absent → the default length/keyword heuristic (lib/router). */
    rules: z.array(routeRuleSchema).optional(),
    /** A user's conversation never moves to a lower tier than its last one (escalation only). */
    sticky_escalation: z.boolean().default(true),
  }).default({ sticky_escalation: true }),
  /** Platform deployment settings (deploy/render); absent for local configs. */
  deploy: deploySchema.optional(),
  /** Peer name → base URL of another function (remote handoff). */
  peers: z.record(z.string().min(1), z.url()).default({}),
  auth: z.strictObject({
    /** Env var with comma-separated API keys, each `key` or `tenant:key` (the tenant id keys
     *  the prefix cache; a bare key is its own tenant); unset/empty → no key required. */
    api_keys_env: z.string().min(1).default("KVRELAY_API_KEYS"),
    /** Env var with the snapshot HMAC key (≥ 16 bytes of text); unset → unsigned snapshots. */
    snapshot_hmac_key_env: z.string().min(1).default("KVRELAY_SNAPSHOT_KEY"),
    snapshot_key_id: z.string().min(1).max(64).default("k1"),
    /** Refuse unsigned snapshots when a key is configured. */
    require_signed_snapshots: z.boolean().default(true),
    /** Env var holding the key GET /metrics then requires (Authorization: Bearer <key>); the
     *  variable must be set when this is. Absent → /metrics is open, like the probes. */
    metrics_key_env: z.string().min(1).optional(),
  }).default({
    api_keys_env: "KVRELAY_API_KEYS",
    snapshot_hmac_key_env: "KVRELAY_SNAPSHOT_KEY",
    snapshot_key_id: "k1",
    require_signed_snapshots: true,
  }),
});

/** A parsed config file (defaults applied), before env secrets are read. */
export type ConfigFile = z.infer<typeof configSchema>;
/** One tier's parsed settings. */
export type TierConfig = z.infer<typeof tierSchema>;
/** One projector entry. */
export type ProjectorConfig = z.infer<typeof projectorSchema>;
/** The store section. */
export type StoreConfig = z.infer<typeof storeSchema>;
/** The deploy section. */
export type DeployConfig = z.infer<typeof deploySchema>;
/** One routing rule. */
export type RouteRule = z.infer<typeof routeRuleSchema>;
