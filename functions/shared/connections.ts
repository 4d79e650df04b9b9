// The HTTP connection lifecycle in front of Deno.serve, which has no idle or head timeout, no
// connection cap, no survivable accept error and no drain that spares a request body in flight
// (docs/http.md "Connections"). This module owns the public listening socket: it accepts (an
// accept failure such as EMFILE is logged once per burst and retried after a short back-off),
// refuses connections above the cap, times idle connections and stalled request heads out, and
// relays each admitted connection's bytes to Deno.serve on a private loopback port. Its handler
// wrapper ties each request to its client connection (by the relay's loopback port) so the gate
// knows which connections are idle and when a drain has settled. HTTP parsing stays Deno's.
import type { Metrics } from "../../lib/serve/mod.ts";

/** How long connections may live and how many may be open. */
export interface ConnectionLimits {
  /** Open client connections at most; one more is answered 503 and closed. */
  maxConnections: number;
  /** A connection with no request in flight and no bytes either way for this long is closed. */
  idleTimeoutMs: number;
  /** A request head must reach the server within this long of its first byte (else 408). */
  headTimeoutMs: number;
}

/** The accepting side the gate needs of a listener (a `Deno.Listener`; tests wrap one). */
export interface Acceptor {
  accept(): Promise<Deno.Conn>;
  close(): void;
}

/** File descriptors one relayed connection holds: the client's, the relay's and Deno.serve's. */
export const FDS_PER_CONNECTION = 3;

/**
 * The soft open-file limit of this process (Linux: /proc/self/limits), or null when unknown.
 * @returns the limit, or null (unlimited or not readable)
 */
export function openFileLimit(): number | null {
  try {
    const text = Deno.readTextFileSync("/proc/self/limits");
    const m = /^Max open files\s+(\d+|unlimited)\s/m.exec(text);
    return m && m[1] !== "unlimited" ? Number(m[1]) : null;
  } catch {
    return null;
  }
}

/**
 * The connection cap: the configured one, at most what the open-file limit leaves after a reserve
 * for everything else the process opens (models, store, peer calls) at three descriptors a
 * connection.
 * @param configured `server.max_connections`, or undefined for "as many as the limit allows"
 * @param fileLimit the soft open-file limit, or null when unknown
 * @returns the cap and, when the configured value had to be lowered, why
 */
export function connectionCap(
  configured: number | undefined,
  fileLimit: number | null,
): { cap: number; lowered: string | null } {
  if (fileLimit === null) return { cap: configured ?? 4096, lowered: null };
  const reserve = Math.min(256, Math.floor(fileLimit / 4));
  const fits = Math.max(1, Math.floor((fileLimit - reserve) / FDS_PER_CONNECTION));
  if (configured === undefined) return { cap: fits, lowered: null };
  if (configured <= fits) return { cap: configured, lowered: null };
  return {
    cap: fits,
    lowered: `server.max_connections ${configured} lowered to ${fits}: the open-file limit is ` +
      `${fileLimit} (${FDS_PER_CONNECTION} per connection, ${reserve} kept for the rest)`,
  };
}

/** Relay read buffers start small (an idle connection holds two) and grow while full reads come
 *  (an upload, a snapshot download), bytes. */
const MIN_BUFFER = 4096;
const MAX_BUFFER = 65536;

const enc = new TextEncoder();

/** A complete HTTP/1.1 error response that closes the connection (written by the gate itself). */
function rawError(status: string, type: string, message: string, param: string | null): Uint8Array {
  const body = JSON.stringify({ error: { type, message, param } });
  const extra = status.startsWith("503") ? "retry-after: 1\r\n" : "";
  return enc.encode(
    `HTTP/1.1 ${status}\r\ncontent-type: application/json\r\ncontent-length: ${
      enc.encode(body).length
    }\r\n${extra}connection: close\r\n\r\n${body}`,
  );
}

/** The JSON 503 a request gets when the server is shutting down. */
function shuttingDown(): Response {
  return Response.json(
    { error: { type: "unavailable_error", message: "server is shutting down", param: null } },
    { status: 503, headers: { "retry-after": "1", connection: "close" } },
  );
}

/** One client connection and its relay. */
interface Tracked {
  client: Deno.Conn;
  relay: Deno.Conn | null;
  /** Requests of this connection whose response is not yet delivered. */
  inFlight: number;
  /** When the first byte of a request head not yet handed to the app arrived, else null. */
  headSince: number | null;
  /** Bytes went either way at this time. */
  lastActive: number;
  /** The client sent request bytes that Deno.serve has not answered a single byte to. */
  unanswered: boolean;
  /** The client's side ended (EOF or error). */
  clientDone: boolean;
  /** The gate is writing its own last answer (408) and then closes. */
  ending: boolean;
  closed: boolean;
}

/** What the gate reports to. */
export interface GateHooks {
  metrics: Metrics;
  /** One log line (the caller prefixes the process name). */
  log(line: string): void;
}

/**
 * The connection lifecycle of one server: owns the listener, relays to Deno.serve.
 * Use: `handler()` wraps the app for Deno.serve on 127.0.0.1:0; `start(port)` begins accepting.
 */
export class ConnectionGate {
  readonly #listener: Acceptor;
  readonly #limits: ConnectionLimits;
  readonly #hooks: GateHooks;
  readonly #conns = new Set<Tracked>();
  /** Relay's local port → its connection (what Deno.serve sees as the remote port). */
  readonly #byPort = new Map<number, Tracked>();
  #upstream = 0;
  #draining = false;
  #settledWaiters: (() => void)[] = [];
  #expire!: () => void;
  readonly #expired = new Promise<void>((r) => this.#expire = r);
  #sweep: ReturnType<typeof setInterval> | undefined;
  #accepting: Promise<void> | null = null;

  /**
   * @param listener the public listening socket
   * @param limits cap and timeouts
   * @param hooks metrics and log
   */
  constructor(listener: Acceptor, limits: ConnectionLimits, hooks: GateHooks) {
    this.#listener = listener;
    this.#limits = limits;
    this.#hooks = hooks;
  }

  /** Client connections open now. */
  get open(): number {
    return this.#conns.size;
  }

  /**
   * Wraps the app's handler: ties each request to its client connection, answers requests that
   * arrive while draining (or are still unanswered when the grace is over) with 503
   * shutting_down, and refuses connections that did not come through the gate.
   * @param handler the app (Hono's `app.fetch`)
   * @returns the handler to give Deno.serve
   */
  handler(
    handler: (
      req: Request,
      info: Deno.ServeHandlerInfo<Deno.NetAddr>,
    ) => Response | Promise<Response>,
  ): (req: Request, info: Deno.ServeHandlerInfo<Deno.NetAddr>) => Response | Promise<Response> {
    return (req, info) => {
      const t = this.#byPort.get(info.remoteAddr.port);
      if (t === undefined) {
        return Response.json({
          error: {
            type: "invalid_request_error",
            message: "connections are accepted on the public port only",
            param: null,
          },
        }, { status: 421, headers: { connection: "close" } });
      }
      t.inFlight++;
      t.headSince = null;
      const done = () => {
        t.inFlight--;
        t.lastActive = performance.now();
        // Half-close toward Deno.serve: it ends the connection once the response is out, and the
        // relay closes the client's side after the last byte.
        if (this.#draining && t.inFlight === 0) t.relay?.closeWrite().catch(() => {});
      };
      info.completed.then(done, done);
      if (this.#draining) return shuttingDown();
      return Promise.race([handler(req, info), this.#expired.then(shuttingDown)]);
    };
  }

  /**
   * Starts accepting and relaying to Deno.serve on the loopback port; called again (Deno.serve
   * restarted after a failure), it points new connections at the new port.
   * @param upstreamPort Deno.serve's port on 127.0.0.1
   */
  start(upstreamPort: number): void {
    this.#upstream = upstreamPort;
    if (this.#accepting !== null) return;
    const { idleTimeoutMs, headTimeoutMs } = this.#limits;
    const period = Math.min(1000, Math.max(10, Math.min(idleTimeoutMs, headTimeoutMs) / 4));
    const sweep = setInterval(() => this.#timeOut(), period);
    Deno.unrefTimer(sweep);
    this.#sweep = sweep;
    this.#accepting = this.#acceptLoop();
  }

  /** Stops accepting and closes every connection with no request in flight; requests in flight
   *  go on, and their connections close once answered. */
  drain(): void {
    if (this.#draining) return;
    this.#draining = true;
    this.#closeListener();
    for (const t of this.#conns) if (t.inFlight === 0) this.#close(t);
    this.#checkSettled();
  }

  /** Answers every request the app has not answered yet with 503 shutting_down (grace over). */
  expire(): void {
    this.#expire();
  }

  /**
   * Resolves once draining and no connection is open: every response in flight has been relayed
   * to its client (Deno.serve's `completed` only says it reached the relay).
   * @returns a promise
   */
  settled(): Promise<void> {
    const p = new Promise<void>((r) => this.#settledWaiters.push(r));
    this.#checkSettled();
    return p;
  }

  /** Closes the listener and every connection now. */
  async close(): Promise<void> {
    this.#draining = true;
    this.#closeListener();
    clearInterval(this.#sweep);
    for (const t of this.#conns) this.#close(t);
    await this.#accepting;
  }

  #closeListener() {
    try {
      this.#listener.close();
    } catch { /* closed by drain() already */ }
  }

  #checkSettled() {
    if (!this.#draining || this.#conns.size > 0) return;
    const ws = this.#settledWaiters;
    this.#settledWaiters = [];
    for (const w of ws) w();
  }

  async #acceptLoop(): Promise<void> {
    let failures = 0;
    let backoffMs = 10;
    while (!this.#draining) {
      let conn: Deno.Conn;
      try {
        conn = await this.#listener.accept();
      } catch (e) {
        if (this.#draining || e instanceof Deno.errors.BadResource) return;
        this.#hooks.metrics.acceptErrors.inc();
        if (failures++ === 0) {
          this.#hooks.log(
            `accept failed (${
              (e as Error).message
            }); retrying with back-off, logged once per burst`,
          );
        }
        await new Promise((r) => setTimeout(r, backoffMs));
        backoffMs = Math.min(1000, backoffMs * 2);
        continue;
      }
      if (failures > 0) {
        this.#hooks.log(`accepting again after ${failures} failed accepts`);
        failures = 0;
        backoffMs = 10;
      }
      if (this.#draining) {
        conn.close();
        return;
      }
      if (this.#conns.size >= this.#limits.maxConnections) {
        this.#refuse(conn);
        continue;
      }
      this.#relay(conn).catch(() => {});
    }
  }

  #refuse(conn: Deno.Conn) {
    this.#hooks.metrics.connectionsRefused.inc({ reason: "limit" });
    const res = rawError(
      "503 Service Unavailable",
      "unavailable_error",
      `too many open connections (server.max_connections ${this.#limits.maxConnections})`,
      null,
    );
    // Best effort: the client may never read; closing right after the write is what matters.
    conn.write(res).catch(() => {}).finally(() => {
      try {
        conn.close();
      } catch { /* already closed */ }
    });
  }

  async #relay(client: Deno.Conn): Promise<void> {
    const now = performance.now();
    const t: Tracked = {
      client,
      relay: null,
      inFlight: 0,
      headSince: null,
      lastActive: now,
      unanswered: false,
      clientDone: false,
      ending: false,
      closed: false,
    };
    this.#conns.add(t);
    this.#hooks.metrics.openConnections.set({}, this.#conns.size);
    let port = -1;
    try {
      const relay = await Deno.connect({ hostname: "127.0.0.1", port: this.#upstream });
      t.relay = relay;
      port = (relay.localAddr as Deno.NetAddr).port;
      this.#byPort.set(port, t);
      if (t.closed) { // drained or timed out while connecting
        relay.close();
        return;
      }
      // SSE frames are small writes: no Nagle delay on either hop.
      (client as Deno.TcpConn).setNoDelay?.(true);
      (relay as Deno.TcpConn).setNoDelay(true);
      await Promise.all([this.#up(t, relay), this.#down(t, relay)]);
    } catch {
      // The relay could not connect (descriptors exhausted): the client is closed below.
      if (t.relay === null) this.#hooks.metrics.connectionsRefused.inc({ reason: "relay_failed" });
    } finally {
      this.#close(t);
      if (port >= 0) this.#byPort.delete(port);
      this.#conns.delete(t);
      this.#hooks.metrics.openConnections.set({}, this.#conns.size);
      this.#checkSettled();
    }
  }

  /** Client → Deno.serve. The client's EOF becomes a half-close, as Deno.serve would see it. */
  async #up(t: Tracked, relay: Deno.Conn): Promise<void> {
    let buf = new Uint8Array(MIN_BUFFER);
    try {
      for (;;) {
        const n = await t.client.read(buf);
        if (n === null) break;
        const bytes = buf.subarray(0, n);
        if (n === buf.length && buf.length < MAX_BUFFER) buf = new Uint8Array(buf.length * 4);
        t.lastActive = performance.now();
        if (t.inFlight === 0 && t.headSince === null) {
          t.headSince = t.lastActive;
          t.unanswered = true;
        }
        await writeAll(relay, bytes);
      }
      t.clientDone = true;
      await relay.closeWrite().catch(() => {});
    } catch {
      t.clientDone = true;
      this.#close(t);
    }
  }

  /** Deno.serve → client. When Deno.serve drops a connection without answering a request it was
   *  sent (a malformed chunked body in its first read), the client gets a JSON 400 naming body. */
  async #down(t: Tracked, relay: Deno.Conn): Promise<void> {
    let buf = new Uint8Array(MIN_BUFFER);
    try {
      for (;;) {
        const n = await relay.read(buf);
        if (n === null) break;
        const bytes = buf.subarray(0, n);
        if (n === buf.length && buf.length < MAX_BUFFER) buf = new Uint8Array(buf.length * 4);
        t.lastActive = performance.now();
        t.unanswered = false;
        if (t.inFlight === 0) t.headSince = null; // Deno.serve answered by itself (its 400s)
        if (t.ending) continue; // the gate's 408 goes out alone
        await writeAll(t.client, bytes);
      }
      if (t.unanswered && !t.clientDone && !t.closed && !t.ending) {
        await writeAll(
          t.client,
          rawError(
            "400 Bad Request",
            "invalid_request_error",
            "request body could not be read: malformed HTTP/1.1 body framing",
            "body",
          ),
        ).catch(() => {});
      }
    } catch {
      // the client or Deno.serve went away: both sides close below
    }
    this.#close(t);
  }

  #timeOut() {
    const now = performance.now();
    const { idleTimeoutMs, headTimeoutMs } = this.#limits;
    for (const t of this.#conns) {
      if (t.inFlight > 0 || t.closed || t.ending) continue;
      if (t.headSince !== null) {
        if (now - t.headSince < headTimeoutMs) continue;
        this.#hooks.metrics.connectionsTimedOut.inc({ reason: "head" });
        const res = rawError(
          "408 Request Timeout",
          "timeout_error",
          `request head not received within ${headTimeoutMs} ms (server.head_timeout_ms)`,
          "headers",
        );
        t.ending = true;
        writeAll(t.client, res).catch(() => {}).finally(() => this.#close(t));
      } else if (now - t.lastActive >= idleTimeoutMs) {
        this.#hooks.metrics.connectionsTimedOut.inc({ reason: "idle" });
        this.#close(t);
      }
    }
  }

  #close(t: Tracked) {
    if (t.closed) return;
    t.closed = true;
    for (const c of [t.client, t.relay]) {
      try {
        c?.close();
      } catch { /* already closed */ }
    }
  }
}

async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  let o = 0;
  while (o < bytes.length) o += await conn.write(bytes.subarray(o));
}
