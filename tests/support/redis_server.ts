// Test support: starts a real, throwaway `redis-server` on a free 127.0.0.1 port (no persistence,
// its own temp dir), can kill/pause/restart it on the same port, and speaks raw RESP for checks.
// Not a store and not for production; tests that need redis skip when the binary is missing.

/** The line that installs the server on Debian/Ubuntu (what skipped tests tell the reader). */
export const REDIS_INSTALL_HINT = "apt-get install -y redis-server";

/**
 * Finds `redis-server` on PATH.
 * @returns its absolute path, or null when it is not installed
 */
export function findRedisServer(): string | null {
  for (const dir of (Deno.env.get("PATH") ?? "").split(":")) {
    if (!dir) continue;
    const p = `${dir}/redis-server`;
    try {
      if (Deno.statSync(p).isFile) return p;
    } catch { /* not here */ }
  }
  return null;
}

/**
 * `Deno.test` ignore/name helper: when redis-server is missing, the suffix names the install line.
 * @returns `{ignore, suffix}`: ignore when the binary is missing, and the text for test names
 */
export function redisTestGate(): { ignore: boolean; suffix: string } {
  return findRedisServer() === null
    ? { ignore: true, suffix: ` (skipped: install redis-server (${REDIS_INSTALL_HINT}))` }
    : { ignore: false, suffix: "" };
}

/** Options of {@link RedisServer.start}. */
export interface RedisServerOptions {
  /** Extra redis-server arguments, e.g. `["--maxmemory", "4mb"]`. */
  args?: string[];
  /** Port to use; default: a free one picked by the OS. */
  port?: number;
  /** Give up waiting for PONG after this many ms. Default 10000. */
  startTimeoutMs?: number;
}

/** A throwaway redis-server process. Always `await server.dispose()` in a `finally`. */
export class RedisServer {
  /** Always 127.0.0.1. */
  readonly host = "127.0.0.1";
  /** The TCP port (stable across {@link RedisServer.restart}). */
  readonly port: number;
  /** Temp dir holding the log (and nothing else: persistence is off). */
  readonly dir: string;
  readonly #args: string[];
  readonly #startTimeoutMs: number;
  #proc: Deno.ChildProcess | undefined;

  private constructor(port: number, dir: string, args: string[], startTimeoutMs: number) {
    this.port = port;
    this.dir = dir;
    this.#args = args;
    this.#startTimeoutMs = startTimeoutMs;
  }

  /** `redis://127.0.0.1:<port>` */
  get url(): string {
    return `redis://${this.host}:${this.port}`;
  }

  /**
   * Starts a server and waits until it answers PING.
   * @param opts extra args, port, start timeout
   * @returns the running server
   * @throws {Error} when redis-server is missing or does not come up (log tail quoted)
   */
  static async start(opts: RedisServerOptions = {}): Promise<RedisServer> {
    if (findRedisServer() === null) {
      throw new Error(`redis-server is not on PATH; install it: ${REDIS_INSTALL_HINT}`);
    }
    const dir = await Deno.makeTempDir({ prefix: "kvr_redis_" });
    const s = new RedisServer(
      opts.port ?? freePort(),
      dir,
      opts.args ?? [],
      opts.startTimeoutMs ?? 10_000,
    );
    try {
      await s.#spawn();
    } catch (e) {
      await s.dispose();
      throw e;
    }
    return s;
  }

  /** Whether the process is running (started and not yet reaped). */
  get running(): boolean {
    return this.#proc !== undefined;
  }

  /**
   * Sends a signal and, for terminating signals, waits for the process to exit.
   * @param signal default SIGKILL (an abrupt crash)
   */
  async kill(signal: Deno.Signal = "SIGKILL"): Promise<void> {
    const p = this.#proc;
    if (!p) return;
    try {
      p.kill(signal);
    } catch { /* already gone */ }
    if (signal === "SIGSTOP" || signal === "SIGCONT") return;
    this.#proc = undefined;
    const timer = setTimeout(() => {
      try {
        p.kill("SIGKILL");
      } catch { /* gone */ }
    }, 3000);
    try {
      await p.status;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Freezes the server (SIGSTOP): connections stay open but nothing is answered. */
  async pause(): Promise<void> {
    await this.kill("SIGSTOP");
  }

  /** Thaws a paused server (SIGCONT). */
  async resume(): Promise<void> {
    await this.kill("SIGCONT");
  }

  /**
   * Starts the server again on the same port (after {@link RedisServer.kill}); data is gone.
   * @throws {Error} when it does not come up
   */
  async restart(): Promise<void> {
    if (this.#proc) await this.kill("SIGTERM");
    await this.#spawn();
  }

  /** Kills the process (if any) and removes the temp dir; safe to call twice. */
  async dispose(): Promise<void> {
    if (this.#proc) {
      try {
        this.#proc.kill("SIGCONT"); // a paused process cannot handle SIGTERM
      } catch { /* gone */ }
      await this.kill("SIGTERM");
    }
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
  }

  /**
   * One command over a fresh raw RESP connection (an oracle independent of the npm client).
   * @param args command and arguments, e.g. `["KEYS", "*"]`
   * @returns the raw reply text, e.g. `"+PONG\r\n"`
   */
  async command(...args: string[]): Promise<string> {
    return await rawCommand(this.host, this.port, args);
  }

  async #spawn(): Promise<void> {
    const bin = findRedisServer();
    if (bin === null) throw new Error(`redis-server is not on PATH: ${REDIS_INSTALL_HINT}`);
    const args = [
      "--port",
      String(this.port),
      "--bind",
      this.host,
      "--save",
      "",
      "--appendonly",
      "no",
      "--dir",
      this.dir,
      "--logfile",
      `${this.dir}/redis.log`,
      "--daemonize",
      "no",
      ...this.#args,
    ];
    const proc = new Deno.Command(bin, { args, stdin: "null", stdout: "null", stderr: "null" })
      .spawn();
    this.#proc = proc;
    let exited = false;
    proc.status.then(() => (exited = true));
    const deadline = Date.now() + this.#startTimeoutMs;
    while (Date.now() < deadline && !exited) {
      try {
        if ((await rawCommand(this.host, this.port, ["PING"])).startsWith("+PONG")) return;
      } catch { /* not listening yet */ }
      await new Promise((r) => setTimeout(r, 20));
    }
    const log = await Deno.readTextFile(`${this.dir}/redis.log`).catch(() => "");
    await this.kill("SIGKILL");
    throw new Error(
      `redis-server on ${this.host}:${this.port} did not answer PING within ${this.#startTimeoutMs} ms${
        exited ? " (it exited)" : ""
      }; log tail: ${log.slice(-500)}`,
    );
  }
}

/** A port that was free a moment ago (the OS picks; tiny race before the server binds). */
function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

/** Sends one RESP command and reads until a complete simple reply or a 1 s quiet period. */
async function rawCommand(host: string, port: number, args: string[]): Promise<string> {
  const conn = await Deno.connect({ hostname: host, port });
  try {
    const enc = new TextEncoder();
    let req = `*${args.length}\r\n`;
    for (const a of args) req += `$${enc.encode(a).byteLength}\r\n${a}\r\n`;
    await conn.write(enc.encode(req));
    const dec = new TextDecoder();
    let out = "";
    const buf = new Uint8Array(65536);
    while (!replyComplete(out)) {
      const timer = setTimeout(() => conn.close(), 2000);
      let n: number | null;
      try {
        n = await conn.read(buf);
      } catch {
        n = null; // closed by the timer
      } finally {
        clearTimeout(timer);
      }
      if (n === null) break;
      out += dec.decode(buf.subarray(0, n), { stream: true });
    }
    return out;
  } finally {
    try {
      conn.close();
    } catch { /* closed by the timer */ }
  }
}

/** Whether `s` holds one whole RESP2 reply (simple, error, integer, bulk or flat array). */
function replyComplete(s: string): boolean {
  let i = 0;
  const line = (): string | null => {
    const j = s.indexOf("\r\n", i);
    if (j < 0) return null;
    const l = s.slice(i, j);
    i = j + 2;
    return l;
  };
  const one = (): boolean => {
    const l = line();
    if (l === null) return false;
    const t = l[0];
    if (t === "+" || t === "-" || t === ":") return true;
    const n = Number(l.slice(1));
    if (t === "$") {
      if (n < 0) return true;
      if (s.length < i + n + 2) return false; // ASCII payloads in tests: chars = bytes
      i += n + 2;
      return true;
    }
    if (t === "*") {
      for (let k = 0; k < n; k++) if (!one()) return false;
      return true;
    }
    return true;
  };
  return s.length > 0 && one();
}
