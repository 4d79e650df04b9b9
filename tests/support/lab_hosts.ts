// Test support: kvrelay function processes and a redis-server as hosts of a NetLab
// (tests/support/netns.ts), started inside their namespaces and waited on until they answer.
// Shared by tests/multihost_handoff_test.ts and bench/multihost.ts; not a process manager.
import type { NetLab } from "./netns.ts";
import { findRedisServer } from "./redis_server.ts";

const root = new URL("../../", import.meta.url).pathname;
/** The port every hosted function listens on (each host has its own address). */
export const LAB_PORT = 8080;
const PORT = LAB_PORT;

/** A kvrelay function process on a lab host (`deno run -A <entry>` with HOST/PORT set). */
export class HostedFunction {
  child: Deno.ChildProcess | null = null;
  #stderr: Uint8Array[] = [];
  constructor(
    readonly lab: NetLab,
    readonly host: string,
    readonly entry: string,
    readonly env: Record<string, string>,
  ) {}
  get base(): string {
    return `http://${this.lab.host(this.host).addr}:${PORT}`;
  }
  async start(): Promise<void> {
    this.#stderr = [];
    const child = this.lab.spawn(
      this.host,
      Deno.execPath(),
      ["run", "-A", `${root}${this.entry}`],
      {
        ...this.env,
        HOST: this.lab.host(this.host).addr,
        PORT: String(PORT),
      },
    );
    this.child = child;
    (async () => {
      for await (const c of child.stderr) this.#stderr.push(c);
    })().catch(() => {});
    await waitFor(
      async () => (await fetchStatus(`${this.base}/readyz`)) === 200,
      60_000,
      () => `${this.entry} on ${this.host} not ready:\n${this.stderrText()}`,
    );
  }
  stderrText(): string {
    return new TextDecoder().decode(new Uint8Array(this.#stderr.flatMap((c) => [...c])));
  }
  async kill(): Promise<void> {
    this.child?.kill("SIGKILL");
    await this.child?.status;
    this.child = null;
  }
}

/** A redis-server with an fsync-per-write append-only file on a lab host. */
export class HostedRedis {
  child: Deno.ChildProcess | null = null;
  constructor(readonly lab: NetLab, readonly dir: string) {}
  get addr(): string {
    return this.lab.host("redis").addr;
  }
  async start(): Promise<void> {
    this.child = this.lab.spawn("redis", findRedisServer()!, [
      "--bind",
      this.addr,
      "--port",
      "6379",
      "--protected-mode",
      "no",
      "--dir",
      this.dir,
      "--save",
      "",
      "--appendonly",
      "yes",
      "--appendfsync",
      "always",
    ]);
    this.child.stderr.cancel().catch(() => {});
    await waitFor(() => this.ping(), 10_000, () => "redis-server did not answer PING");
  }
  async ping(): Promise<boolean> {
    try {
      const conn = await Deno.connect({ hostname: this.addr, port: 6379 });
      try {
        await conn.write(new TextEncoder().encode("PING\r\n"));
        const buf = new Uint8Array(16);
        const n = await conn.read(buf);
        return n !== null && new TextDecoder().decode(buf.subarray(0, n)).startsWith("+PONG");
      } finally {
        conn.close();
      }
    } catch {
      return false;
    }
  }
  async kill(): Promise<void> {
    this.child?.kill("SIGKILL");
    await this.child?.status;
    this.child = null;
  }
}

export async function fetchStatus(url: string): Promise<number | null> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
    await res.body?.cancel();
    return res.status;
  } catch {
    return null;
  }
}

export async function waitFor(
  cond: () => Promise<boolean>,
  timeoutMs: number,
  why: () => string,
): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(why());
}
