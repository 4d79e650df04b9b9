// Support for end-to-end tests: writes a deployment config into a temp dir, starts a real kvrelay
// process (functions/main.ts or one function's main.ts) on a free loopback port, waits for
// /readyz, and stops it with SIGTERM. Tests only; not a process manager.

const root = new URL("../", import.meta.url).pathname;

/** A tier `sampling` that overrides every generation_config.json default: greedy, nothing else
 *  (as functions/shared/test_helpers.ts NEUTRAL_SAMPLING). */
export const NEUTRAL_SAMPLING = {
  temperature: 0,
  top_p: 1,
  top_k: 0,
  min_p: 0,
  repetition_penalty: 1,
};

/** A free loopback TCP port. */
export function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

const tempDirs = new Set<string>();

/**
 * Removes `dir` (recursively) when this test module's process or worker ends.
 * @param dir a temp dir the test made
 */
export function removeAtExit(dir: string): void {
  if (tempDirs.size === 0) {
    globalThis.addEventListener("unload", () => {
      for (const d of tempDirs) {
        try {
          Deno.removeSync(d, { recursive: true });
        } catch {
          // already gone
        }
      }
    });
  }
  tempDirs.add(dir);
}

/**
 * Writes a config with demo tiers (absolute model paths) into a new temp dir.
 * @param tiers tier name → demo model dir name
 * @param tier settings merged into every tier
 * @param extra top-level fields
 * @returns the config path (its dir is the temp dir, removed when the test module ends)
 */
export async function writeConfig(
  tiers: Record<string, string>,
  tier: Record<string, unknown> = {},
  extra: Record<string, unknown> = {},
): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "kvrelay-e2e-" });
  removeAtExit(dir);
  const t: Record<string, unknown> = {};
  for (const [name, model] of Object.entries(tiers)) {
    t[name] = {
      model: `${root}models/${model}`,
      threads: 1,
      max_context: 1024,
      max_new_tokens: 256,
      // Greedy with no filter or penalty, on purpose: these tests compare answers token for token
      // with the engine's plain options (the demo models' generation_config.json would sample).
      // Tests of those defaults override `sampling`.
      sampling: NEUTRAL_SAMPLING,
      ...tier,
    };
  }
  const path = `${dir}/config.json`;
  await Deno.writeTextFile(path, JSON.stringify({ tiers: t, ...extra }));
  return path;
}

/** A running kvrelay process. */
export interface Server {
  base: string;
  port: number;
  child: Deno.ChildProcess;
  /** SIGTERM, wait for exit; returns the status and stderr text. */
  stop(): Promise<{ status: Deno.CommandStatus; stderr: string }>;
}

/**
 * Starts `entry` (relative to the repo root) with env, waits until /readyz answers 200.
 * @param entry e.g. "functions/main.ts"
 * @param env extra environment (PORT and HOST are set)
 * @param timeoutMs readiness deadline
 * @param nofile the process's open-file limit (`ulimit -n`), when it must be small
 * @returns the server
 * @throws Error with the process's stderr when it exits or is not ready in time
 */
export async function startServer(
  entry: string,
  env: Record<string, string>,
  timeoutMs = 60_000,
  nofile?: number,
): Promise<Server> {
  const port = env.PORT ? Number(env.PORT) : freePort();
  const run = [Deno.execPath(), "run", "-A", `${root}${entry}`];
  const [cmd, ...args] = nofile === undefined
    ? run
    : ["sh", "-c", `ulimit -n ${nofile} && exec "$0" "$@"`, ...run];
  const child = new Deno.Command(cmd, {
    args,
    env: { PORT: String(port), HOST: "127.0.0.1", ...env },
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const chunks: Uint8Array[] = [];
  const pump = (async () => {
    for await (const c of child.stderr) chunks.push(c);
  })();
  const stderrText = () => new TextDecoder().decode(new Uint8Array(chunks.flatMap((c) => [...c])));
  const base = `http://127.0.0.1:${port}`;
  let exited = false;
  const statusP = child.status.then((s) => {
    exited = true;
    return s;
  });
  const stop = async () => {
    if (!exited) child.kill("SIGTERM");
    const status = await statusP;
    await pump;
    return { status, stderr: stderrText() };
  };
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline && !exited) {
    try {
      const res = await fetch(`${base}/readyz`);
      await res.body?.cancel();
      if (res.ok) return { base, port, child, stop };
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 150));
  }
  const { stderr } = await stop();
  throw new Error(`${entry} not ready within ${timeoutMs} ms:\n${stderr}`);
}
