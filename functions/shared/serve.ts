// Process-level serving shared by every function's main.ts: loads the deployment config (refusing
// to start on any problem, each listed by path), serves the app at once (/healthz answers, /readyz
// says 503 while models load) behind the connection gate (connections.ts), loads the tiers, and
// shuts down gracefully on SIGTERM/SIGINT: stop accepting, let in-flight requests finish within
// the grace period, then answer the rest 503 and exit, closing any connection still open.
import type { Hono } from "hono";
import { ConfigError, loadConfig } from "../../lib/config/mod.ts";
import {
  createRuntime,
  preflightProblems,
  projectorPartProblems,
  resolveTierBackends,
  type Runtime,
  TierBackendError,
} from "../../lib/serve/mod.ts";
import { createBaseApp } from "./app.ts";
import { connectionCap, ConnectionGate, openFileLimit } from "./connections.ts";

/** "port in use" before anything loads, naming PORT (Deno.serve would throw AddrInUse later). */
function portProblems(host: string, port: number): string[] {
  if (port === 0) return [];
  try {
    Deno.listen({ hostname: host, port }).close();
  } catch (e) {
    if (e instanceof Deno.errors.AddrInUse) {
      return [
        `server.port: ${port} on ${host} is in use: set PORT to a free port (e.g. PORT=${
          port + 1
        })`,
      ];
    }
    if (e instanceof Deno.errors.PermissionDenied) {
      return [`server.port: ${port} on ${host} needs privileges: set PORT above 1023`];
    }
    throw e;
  }
  return [];
}

/** `--help` prints how a serving process is configured; any other argument is refused. */
function usageExit(name: string, args: string[]): never {
  const usage = `usage: ${
    name === "all" ? "deno task start" : `deno run -A functions/${name}/main.ts`
  }   (no arguments: configured by the environment)
  KVRELAY_CONFIG  deployment config file (default: config/local.json; README "Serve your own model")
  PORT, HOST      where to listen (default: the config's server.port 8080, server.host 0.0.0.0)
  KVRELAY_LIB     libkvrelay.so to load (default: build/native/libkvrelay.so)
  secrets         the variables the config names (KVRELAY_API_KEYS, KVRELAY_SNAPSHOT_KEY, ...)`;
  if (args.length === 1 && (args[0] === "--help" || args[0] === "-h")) {
    console.log(usage);
    Deno.exit(0);
  }
  console.error(`kvrelay ${name}: unexpected argument "${args[0]}"\n${usage}`);
  Deno.exit(2);
}

/** Adds one function's routes to an app. */
export type Register = (app: Hono, rt: Runtime) => void;

/**
 * Runs a process serving the given functions until a signal.
 * @param name process name for logs and metrics ("generate", "all", ...)
 * @param registers the functions' route registrations
 * @returns when the server has shut down
 */
export async function serveFunctions(name: string, registers: Register[]): Promise<void> {
  // Every module has been evaluated by now (the entry point's static imports).
  const modulesMs = performance.now();
  if (Deno.args.length > 0) usageExit(name, Deno.args);
  let config;
  try {
    config = await loadConfig();
  } catch (e) {
    if (e instanceof ConfigError) {
      console.error(`kvrelay ${name}: refusing to start: ${e.message}`);
      Deno.exit(2);
    }
    throw e;
  }
  try {
    resolveTierBackends(config); // `backend: cuda` without a usable device: refuse, exit 2
  } catch (e) {
    if (e instanceof TierBackendError) {
      console.error(`kvrelay ${name}: refusing to start: ${e.message}`);
      Deno.exit(2);
    }
    throw e;
  }
  // Model folders, KV pools (kv_pool_mb derived when absent), projector pairs, and the optional
  // parts a configured projector needs (onnxruntime-node for kind onnx): any problem → exit 2.
  const problems = [
    ...await preflightProblems(config),
    ...await projectorPartProblems(config),
    ...portProblems(config.server.host, config.server.port),
  ];
  if (problems.length > 0) {
    const list = problems.length === 1
      ? problems[0]
      : `\n${problems.map((p) => `  - ${p}`).join("\n")}`;
    console.error(`kvrelay ${name}: refusing to start (${config.source}): ${list}`);
    Deno.exit(2);
  }
  const rt = await createRuntime(config);
  rt.startup.modulesMs = modulesMs;
  const app = createBaseApp(rt, name);
  for (const r of registers) r(app, rt);
  const { port, host } = config.server;
  // The public socket is the connection gate's (timeouts, cap, survivable accept errors, a drain
  // that spares bodies in flight); Deno.serve parses HTTP behind it on a private loopback port.
  const listener = Deno.listen({ port, hostname: host });
  const { cap, lowered } = connectionCap(config.server.max_connections, openFileLimit());
  if (lowered) console.error(`kvrelay ${name}: ${lowered}`);
  const gate = new ConnectionGate(listener, {
    maxConnections: cap,
    idleTimeoutMs: config.server.idle_timeout_ms,
    headTimeoutMs: config.server.head_timeout_ms,
  }, { metrics: rt.metrics, log: (line) => console.error(`kvrelay ${name}: ${line}`) });
  const handler = gate.handler(app.fetch);
  let stopping = false;
  // Deno.serve ends when an accept of its own fails (descriptors exhausted by something else):
  // serve again on a new port rather than leave the gate relaying to nothing.
  const serveHttp = (): Deno.HttpServer<Deno.NetAddr> => {
    const s = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen: () => {} }, handler);
    gate.start(s.addr.port);
    s.finished.then(() => "ended", (e) => (e as Error)?.message ?? String(e)).then((why) => {
      if (stopping) return;
      console.error(`kvrelay ${name}: the HTTP server stopped (${why}); serving again`);
      setTimeout(() => server = serveHttp(), 100);
    });
    return s;
  };
  let server = serveHttp();
  rt.startup.listeningMs = performance.now();
  console.error(
    `kvrelay ${name} listening on http://${host}:${(listener.addr as Deno.NetAddr).port}`,
  );
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    rt.startDrain();
    console.error(`kvrelay ${name}: draining (grace ${config.server.shutdown_grace_ms} ms)`);
    // Not server.shutdown(): it fails the body reads of requests in flight (a 400 to an upload).
    gate.drain();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const grace = new Promise<"timeout">((r) => {
      timer = setTimeout(() => r("timeout"), config.server.shutdown_grace_ms);
    });
    const outcome = await Promise.race([gate.settled().then(() => "done" as const), grace]);
    clearTimeout(timer);
    if (outcome === "timeout") {
      console.error(`kvrelay ${name}: grace period over, stopping in-flight requests`);
      // Body reads and generations end with 503 shutting_down; so does any request not answered.
      rt.abortInFlight();
      gate.expire();
      let t2: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([gate.settled(), new Promise((r) => t2 = setTimeout(r, 2000))]);
      clearTimeout(t2);
    }
    await rt.close();
    console.error(`kvrelay ${name}: stopped`);
    // Connections still open now (a client stalled mid-upload, a peer that never reads) are
    // closed by the exit.
    Deno.exit(0);
  };
  Deno.addSignalListener("SIGTERM", stop);
  Deno.addSignalListener("SIGINT", stop);
  try {
    await rt.load();
    const s = rt.startup;
    const ms = (v: number | null) => v === null ? "?" : v.toFixed(0);
    console.error(
      `kvrelay ${name}: ready (tiers: ${[...rt.tiers.keys()].join(", ")}) at ${ms(s.readyMs)} ms ` +
        `after start (modules ${ms(s.modulesMs)}, listening ${ms(s.listeningMs)}, ` +
        `projectors ${ms(s.projectorsMs)} ms)`,
    );
  } catch (e) {
    console.error(`kvrelay ${name}: failed to load models: ${(e as Error).message}`);
    stopping = true;
    await gate.close();
    await server.shutdown();
    Deno.exit(1);
  }
  // Serving until a signal: stop() exits the process.
  await new Promise(() => {});
}
