// One deployment, as the renderers see it: a deploy config (deploy/configs/<name>.json) parsed by
// the same lib/config the server runs with, plus the values every platform derives from it
// (entry point, autoscaling target, deadlines, secret env names, CPU/GPU resources). No platform
// syntax here: knative.ts, cloudrun.ts, modal.ts and runpod.ts turn a spec into files.
import { type ConfigFile, type DeployConfig, parseConfig } from "../../lib/config/mod.ts";

/** A deploy config that cannot be rendered; `param` names the config field at fault. */
export class RenderError extends Error {
  /** Config field (dotted path) the problem is about. */
  readonly param: string;
  /**
   * @param source config file the deployment came from
   * @param param dotted config path at fault
   * @param message what is wrong, quoting values
   */
  constructor(source: string, param: string, message: string) {
    super(`${source}: ${param}: ${message}`);
    this.name = "RenderError";
    this.param = param;
  }
}

/** CPU image or CUDA image (every tier of the config runs `backend: cuda`). */
export type Variant = "cpu" | "cuda";

/** Everything a platform renderer needs, derived once. */
export interface DeploymentSpec {
  /** Config path relative to the repository root, e.g. "deploy/configs/fast.json". */
  configPath: string;
  variant: Variant;
  deploy: DeployConfig;
  /** Service name on the platform ("-cuda" appended for the GPU variant). */
  name: string;
  /** Image reference with the variant's tag. */
  image: string;
  /** Entry module relative to the repository root (the image's working directory). */
  entry: string;
  /** Container port (server.port; platforms pass PORT too). */
  port: number;
  /** Requests one instance runs at once (autoscaling target): the served tier's `max_batch` when it
   *  batches, else its `concurrency`. */
  targetConcurrency: number;
  /** Requests one instance accepts: running + waiting (that + `queue_depth`). */
  maxConcurrency: number;
  /** Platform request timeout, seconds: the served tier's `request_timeout_ms`, rounded up. */
  requestTimeoutS: number;
  /** Drain period on SIGTERM, seconds (server.shutdown_grace_ms, rounded up). */
  drainS: number;
  /** Env variable names the config reads secrets from (sorted). */
  secretEnv: string[];
  /** vCPUs and memory of one instance. */
  cpu: number;
  memoryMib: number;
  /** GPUs of one instance (0 for the CPU variant). */
  gpus: number;
}

/** Seconds between the end of the drain and process exit (model free, store close). */
export const CLOSE_SLACK_S = 2;

/**
 * The secret env names a config reads: API keys, snapshot HMAC key, prefix-cache tenant salt and,
 * for a redis store, its URL.
 * @param cfg a parsed config
 * @returns the names, sorted
 */
export function secretEnvNames(cfg: ConfigFile): string[] {
  const names = new Set([
    cfg.auth.api_keys_env,
    cfg.auth.snapshot_hmac_key_env,
    cfg.prefix_cache.tenant_salt_env,
  ]);
  if (cfg.store.kind === "redis") names.add(cfg.store.url_env);
  return [...names].sort();
}

/**
 * The CUDA variant of a deploy config's JSON: the same file with every tier on `backend: cuda`.
 * @param json the config file's parsed JSON (not the zod output: defaults stay implicit)
 * @returns a new object
 */
export function cudaConfigJson(json: Record<string, unknown>): Record<string, unknown> {
  const out = structuredClone(json);
  const tiers = out.tiers as Record<string, Record<string, unknown>>;
  for (const t of Object.values(tiers)) t.backend = "cuda";
  return out;
}

/**
 * Parses a deploy config with the server's validator (placeholder secrets: rendering needs their
 * names, never their values) and derives the deployment.
 * @param configPath path relative to the repository root
 * @param json the file's parsed JSON
 * @param variant which image and resources
 * @returns the spec
 * @throws {ConfigError} for an invalid config (every problem by path); {RenderError} when the
 *   config has no `deploy` section
 */
export function deploymentSpec(
  configPath: string,
  json: unknown,
  variant: Variant,
): DeploymentSpec {
  // PORT/HOST stay unset (the file's values are the container's); secrets get a placeholder.
  const env = (name: string) =>
    name === "PORT" || name === "HOST" ? undefined : "rendering-placeholder-secret";
  const cfg = parseConfig(json, { env, source: configPath });
  const deploy = cfg.deploy;
  if (deploy === undefined) {
    throw new RenderError(
      configPath,
      "deploy",
      "missing: a rendered config needs a deploy section",
    );
  }
  const tier = cfg.tiers[deploy.tier];
  const entry = deploy.function === "all"
    ? "functions/main.ts"
    : `functions/${deploy.function}/main.ts`;
  const gpu = variant === "cuda";
  // Requests one instance runs at once: the rows a batching tier steps together, else its slots.
  const running = tier.batching ? tier.max_batch : tier.concurrency;
  return {
    configPath,
    variant,
    deploy,
    name: gpu ? `${deploy.name}-cuda` : deploy.name,
    image: `${deploy.image}:${variant}`,
    entry,
    port: cfg.server.port === 0 ? 8080 : cfg.server.port,
    targetConcurrency: running,
    maxConcurrency: running + tier.queue_depth,
    requestTimeoutS: Math.ceil(tier.request_timeout_ms / 1000),
    drainS: Math.ceil(cfg.server.shutdown_grace_ms / 1000),
    secretEnv: secretEnvNames(cfg),
    cpu: gpu ? deploy.gpu.cpu : deploy.cpu,
    memoryMib: gpu ? deploy.gpu.memory_mib : deploy.memory_mib,
    gpus: gpu ? 1 : 0,
  };
}

/** Kubernetes quantity of a CPU count ("2", "500m"). */
export function cpuQuantity(cpu: number): string {
  return Number.isInteger(cpu) ? String(cpu) : `${Math.round(cpu * 1000)}m`;
}

/** Kubernetes quantity of MiB ("2Gi" when whole GiB, else "1536Mi"). */
export function memoryQuantity(mib: number): string {
  return mib % 1024 === 0 ? `${mib / 1024}Gi` : `${mib}Mi`;
}

/** Header comment of every rendered file (`#` comment syntax). */
export function renderedHeader(spec: DeploymentSpec, what: string): string {
  return [
    `# ${what}`,
    `# Rendered by \`deno task deploy render\` from ${spec.configPath} (${spec.variant} variant).`,
    "# Do not edit: change the config and render again (a test fails when this file is stale).",
  ].join("\n") + "\n";
}
