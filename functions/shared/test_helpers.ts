// Test support for the function apps: a Runtime over the real demo tiers built from an inline
// config (one thread per model, small limits), and small request helpers. Tests only.
import { parseConfig } from "../../lib/config/mod.ts";
import { createRuntime, type Runtime } from "../../lib/serve/mod.ts";
import type { SnapshotStore } from "../../lib/store/mod.ts";

const modelsDir = new URL("../../models/", import.meta.url).pathname;

/** A tier `sampling` that overrides every generation_config.json default: greedy, nothing else. */
export const NEUTRAL_SAMPLING = {
  temperature: 0,
  top_p: 1,
  top_k: 0,
  min_p: 0,
  repetition_penalty: 1,
} as const;

/** Options of {@link testRuntime}. */
export interface TestRuntimeOptions {
  /** Tier name → demo model directory name, or an absolute checkpoint path (default fast →
   *  tiny-fast). */
  tiers?: Record<string, string>;
  /** Per-tier settings merged into every tier. */
  tier?: Record<string, unknown>;
  /** Top-level config fields merged in (server, auth, projectors, router, ...). */
  config?: Record<string, unknown>;
  /** Environment seen by the config loader. */
  env?: Record<string, string>;
  /** Load models (default true). */
  load?: boolean;
  /** Replaces the store built from the config. */
  store?: SnapshotStore;
}

/**
 * Builds (and by default loads) a runtime over demo tiers.
 * @param opts tiers, per-tier settings, config fields, env
 * @returns the runtime; close it with `rt.close()`
 */
export async function testRuntime(opts: TestRuntimeOptions = {}): Promise<Runtime> {
  const tiers: Record<string, unknown> = {};
  for (const [name, dir] of Object.entries(opts.tiers ?? { fast: "tiny-fast" })) {
    tiers[name] = {
      model: dir.startsWith("/") ? dir : `${modelsDir}${dir}`,
      threads: 1,
      max_context: 512,
      max_new_tokens: 128,
      default_max_tokens: 8,
      concurrency: 2,
      queue_depth: 4,
      // Greedy with no filter or penalty, on purpose: these tests compare answers token for token
      // with the engine's plain options (the demo models' generation_config.json would sample).
      // Tests of those defaults override `sampling`.
      sampling: NEUTRAL_SAMPLING,
      ...opts.tier,
    };
  }
  const env = opts.env ?? {};
  const config = parseConfig(
    { tiers, server: { max_body_bytes: 8192, max_snapshot_bytes: 1 << 20 }, ...opts.config },
    { env: (n) => env[n], baseDir: modelsDir },
  );
  const rt = await createRuntime(config, { store: opts.store });
  if (opts.load ?? true) await rt.load();
  return rt;
}

/**
 * A JSON POST request init.
 * @param body serialized with JSON.stringify (or `raw` as is)
 * @param headers extra headers
 * @returns the RequestInit
 */
export function post(
  body: unknown,
  headers: Record<string, string> = {},
  raw?: string,
): RequestInit {
  return {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: raw ?? JSON.stringify(body),
  };
}

/** A parsed JSON frame in tests (shape asserted field by field). */
// deno-lint-ignore no-explicit-any
export type Json = any;

/**
 * Reads an SSE body into its `data:` payloads (JSON-parsed, "[DONE]" kept as the string).
 * @param res the response
 * @returns the payloads in order
 */
export async function readSse(res: Response): Promise<Json[]> {
  const text = await res.text();
  return text.split("\n\n").filter((f) => f.startsWith("data: ")).map((f) => {
    const d = f.slice(6);
    return d === "[DONE]" ? d : JSON.parse(d);
  });
}

/**
 * The value of one series in Prometheus text (0 when absent).
 * @param text exposition text
 * @param series the series, e.g. `kvrelay_active_sequences{tier="fast"}`
 * @returns its value
 */
export function metricValue(text: string, series: string): number {
  for (const line of text.split("\n")) {
    if (line.startsWith(series + " ")) return Number(line.slice(series.length + 1));
  }
  return 0;
}
