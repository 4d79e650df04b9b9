// Reads a deployment config: the JSON file (KVRELAY_CONFIG, else the bundled config/local.json),
// the zod schema, cross-field checks, then env overrides (PORT, HOST) and secrets from the env
// variables the file names. Every problem is collected and reported by path; nothing is loaded.
import { z } from "zod";
import { type ConfigFile, configSchema, type TierConfig } from "./schema.ts";

/** The config could not be used; `problems` lists each one as "path: message". */
export class ConfigError extends Error {
  /** Every problem found, one line each, "path: message". */
  readonly problems: string[];
  /**
   * @param source the file (or "inline") the config came from
   * @param problems one line per problem
   */
  constructor(source: string, problems: string[]) {
    super(`invalid config ${source}:\n${problems.map((p) => `  - ${p}`).join("\n")}`);
    this.name = "ConfigError";
    this.problems = problems;
  }
}

/** Secrets and overrides read from the environment. */
export interface ConfigSecrets {
  /** Accepted API keys; empty → no key required. */
  apiKeys: string[];
  /** The tenant id of each key in `apiKeys` (same index): its `tenant:` prefix, else null (the
   *  key's own identity is its tenant). */
  apiKeyTenants: (string | null)[];
  /** Snapshot HMAC key bytes (UTF-8 of the env value), or null when unset. */
  snapshotKey: Uint8Array | null;
  /** Redis URL when the store is redis. */
  redisUrl: string | null;
  /** Mixed into prefix-cache keys; null when unset (the runtime then draws a random one). */
  tenantSalt: string | null;
  /** The key GET /metrics requires, or null when metrics are open (auth.metrics_key_env). */
  metricsKey: string | null;
}

/** A ready config: the file with defaults, absolute paths, env overrides and secrets. */
export interface KvrelayConfig extends ConfigFile {
  /** Where it came from (absolute path, or "inline"). */
  source: string;
  /** Tier names from lowest to highest. */
  tierOrder: string[];
  /** default_tier resolved (first tier when absent). */
  defaultTier: string;
  secrets: ConfigSecrets;
}

/** Path of the bundled config. */
export const BUNDLED_CONFIG_PATH: string = new URL("../../config/local.json", import.meta.url)
  .pathname;

function issuePath(path: PropertyKey[]): string {
  return path.length === 0 ? "(root)" : path.map(String).join(".");
}

/** ` (got <value>)` for the value a zod issue is about, when the input has one to quote. */
function quoted(json: unknown, path: PropertyKey[]): string {
  let v: unknown = json;
  for (const k of path) {
    if (v === null || typeof v !== "object") return "";
    v = (v as Record<PropertyKey, unknown>)[k];
  }
  if (v === undefined || (typeof v === "object" && v !== null)) return "";
  const text = JSON.stringify(v);
  return text.length <= 80 ? ` (got ${text})` : "";
}

function resolvePath(base: string, p: string): string {
  if (p.startsWith("/")) return p;
  return new URL(p, `file://${base.endsWith("/") ? base : base + "/"}`).pathname.replace(/\/$/, "");
}

function crossChecks(cfg: ConfigFile): string[] {
  const problems: string[] = [];
  const tiers = Object.keys(cfg.tiers);
  const has = (t: string) => tiers.includes(t);
  if (cfg.default_tier !== undefined && !has(cfg.default_tier)) {
    problems.push(`default_tier: unknown tier "${cfg.default_tier}" (tiers: ${tiers.join(", ")})`);
  }
  for (const [name, t] of Object.entries(cfg.tiers) as [string, TierConfig][]) {
    if (t.default_max_tokens > t.max_new_tokens) {
      problems.push(
        `tiers.${name}.default_max_tokens: ${t.default_max_tokens} exceeds max_new_tokens ${t.max_new_tokens}`,
      );
    }
    if (t.max_new_tokens >= t.max_context) {
      problems.push(
        `tiers.${name}.max_new_tokens: ${t.max_new_tokens} leaves no room for a prompt in max_context ${t.max_context}`,
      );
    }
  }
  if (cfg.deploy !== undefined && !has(cfg.deploy.tier)) {
    problems.push(`deploy.tier: unknown tier "${cfg.deploy.tier}" (tiers: ${tiers.join(", ")})`);
  }
  cfg.projectors.forEach((p, i) => {
    if (!has(p.from)) problems.push(`projectors.${i}.from: unknown tier "${p.from}"`);
    if (!has(p.to)) problems.push(`projectors.${i}.to: unknown tier "${p.to}"`);
    if (p.from === p.to) problems.push(`projectors.${i}: from and to are both "${p.from}"`);
  });
  cfg.router.rules?.forEach((r, i) => {
    if (!has(r.tier)) problems.push(`router.rules.${i}.tier: unknown tier "${r.tier}"`);
    if (r.min_tokens !== undefined && r.max_tokens !== undefined && r.min_tokens > r.max_tokens) {
      problems.push(
        `router.rules.${i}: min_tokens ${r.min_tokens} is above max_tokens ${r.max_tokens}`,
      );
    }
  });
  return problems;
}

/**
 * Validates a config object (already parsed JSON) and applies env overrides and secrets.
 * @param json the config object
 * @param opts `env`: environment lookup (default Deno.env.get); `baseDir`: directory relative
 *   paths resolve against; `source`: name quoted in errors
 * @returns the ready config
 * @throws {ConfigError} listing every problem by path (schema, cross-field, env)
 */
export function parseConfig(
  json: unknown,
  opts: { env?: (name: string) => string | undefined; baseDir?: string; source?: string } = {},
): KvrelayConfig {
  const env = opts.env ?? ((n: string) => Deno.env.get(n));
  const source = opts.source ?? "inline";
  const parsed = configSchema.safeParse(json);
  if (!parsed.success) {
    throw new ConfigError(
      source,
      parsed.error.issues.map((i) => `${issuePath(i.path)}: ${i.message}${quoted(json, i.path)}`),
    );
  }
  const cfg = structuredClone(parsed.data);
  const problems = crossChecks(cfg);
  const port = env("PORT");
  if (port !== undefined && port !== "") {
    const n = Number(port);
    if (!Number.isInteger(n) || n < 0 || n > 65535) {
      problems.push(`env PORT: must be an integer in [0, 65535], got "${port}"`);
    } else cfg.server.port = n;
  }
  const host = env("HOST");
  if (host) cfg.server.host = host;
  const keyText = env(cfg.auth.snapshot_hmac_key_env);
  let snapshotKey: Uint8Array | null = null;
  if (keyText !== undefined && keyText !== "") {
    snapshotKey = new TextEncoder().encode(keyText);
    if (snapshotKey.length < 16) {
      problems.push(
        `env ${cfg.auth.snapshot_hmac_key_env}: snapshot HMAC key must be at least 16 bytes, got ${snapshotKey.length}`,
      );
    }
  }
  let metricsKey: string | null = null;
  if (cfg.auth.metrics_key_env !== undefined) {
    metricsKey = env(cfg.auth.metrics_key_env) || null;
    if (metricsKey === null) {
      problems.push(
        `env ${cfg.auth.metrics_key_env}: required by auth.metrics_key_env (the /metrics key)`,
      );
    }
  }
  let redisUrl: string | null = null;
  if (cfg.store.kind === "redis") {
    redisUrl = env(cfg.store.url_env) ?? null;
    if (!redisUrl) problems.push(`env ${cfg.store.url_env}: required by store.kind "redis"`);
  }
  const baseDir = opts.baseDir ?? Deno.cwd();
  for (const t of Object.values(cfg.tiers)) t.model = resolvePath(baseDir, t.model);
  for (const p of cfg.projectors) p.path = resolvePath(baseDir, p.path);
  if (cfg.store.kind === "fs") cfg.store.dir = resolvePath(baseDir, cfg.store.dir);
  if (problems.length > 0) throw new ConfigError(source, problems);
  const tierOrder = Object.keys(cfg.tiers);
  const keyEntries = (env(cfg.auth.api_keys_env) ?? "").split(",").map((k) => k.trim()).filter((
    k,
  ) => k.length > 0).map((entry) => {
    // ":" is outside the base64, base64url and hex alphabets keys are usually written in.
    const m = /^([A-Za-z0-9_.-]{1,64}):(.+)$/.exec(entry);
    return m ? { key: m[2], tenant: m[1] } : { key: entry, tenant: null };
  });
  // A key a Bearer header cannot carry (RFC 6750 token68) could never authenticate. The message
  // names the entry's position only: the variable holds secrets.
  keyEntries.forEach((e, i) => {
    if (!/^[A-Za-z0-9._~+/-]+=*$/.test(e.key)) {
      problems.push(
        `env ${cfg.auth.api_keys_env}: entry ${
          i + 1
        }'s key has characters a Bearer token cannot carry (allowed: letters, digits, . _ ~ + / - and trailing =)`,
      );
    }
  });
  if (problems.length > 0) throw new ConfigError(source, problems);
  return {
    ...cfg,
    source,
    tierOrder,
    defaultTier: cfg.default_tier ?? tierOrder[0],
    secrets: {
      apiKeys: keyEntries.map((e) => e.key),
      apiKeyTenants: keyEntries.map((e) => e.tenant),
      snapshotKey,
      redisUrl,
      tenantSalt: env(cfg.prefix_cache.tenant_salt_env) || null,
      metricsKey,
    },
  };
}

/**
 * Loads the deployment config: `path`, else env `KVRELAY_CONFIG`, else the bundled
 * config/local.json. Relative paths inside resolve against the file's directory.
 * @param path config file path (optional)
 * @param env environment lookup (default Deno.env.get)
 * @returns the ready config
 * @throws {ConfigError} for an unreadable file, invalid JSON, or any invalid field (all listed)
 */
export async function loadConfig(
  path?: string,
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): Promise<KvrelayConfig> {
  const file = path ?? env("KVRELAY_CONFIG") ?? BUNDLED_CONFIG_PATH;
  const abs = file.startsWith("/") ? file : `${Deno.cwd()}/${file}`;
  let text: string;
  try {
    text = await Deno.readTextFile(abs);
  } catch (e) {
    throw new ConfigError(abs, [`(file): cannot read: ${(e as Error).message}`]);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new ConfigError(abs, [`(file): not valid JSON: ${(e as Error).message}`]);
  }
  const baseDir = abs.slice(0, abs.lastIndexOf("/")) || "/";
  return parseConfig(json, { env, baseDir, source: abs });
}

/** Re-exported for callers that validate fragments. */
export { z };
