// The connection gate over real sockets: a real listener and Deno.serve behind it, raw clients
// (Deno.connect) that stay idle, stall a head, exceed the cap, send a broken chunked body; an
// accept that fails; a drain with a body in flight.
import * as assert from "node:assert/strict";
import { Metrics } from "../../lib/serve/mod.ts";
import {
  type Acceptor,
  connectionCap,
  ConnectionGate,
  type ConnectionLimits,
} from "./connections.ts";

const enc = new TextEncoder();
const dec = new TextDecoder();

interface Running {
  port: number;
  gate: ConnectionGate;
  metrics: Metrics;
  logs: string[];
  close(): Promise<void>;
}

/** Echoes the body length; GET /slow waits for `release`. */
async function echo(req: Request): Promise<Response> {
  if (req.method === "POST") {
    try {
      let n = 0;
      for await (const c of req.body!) n += c.length;
      return Response.json({ n });
    } catch (e) {
      return Response.json({ error: { message: String(e), param: "body" } }, { status: 400 });
    }
  }
  return new Response("ok");
}

function start(
  limits: Partial<ConnectionLimits> = {},
  wrap: (l: Deno.Listener) => Acceptor = (l) => l,
): Running {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const metrics = new Metrics();
  const logs: string[] = [];
  const gate = new ConnectionGate(wrap(listener), {
    maxConnections: 100,
    idleTimeoutMs: 10_000,
    headTimeoutMs: 10_000,
    ...limits,
  }, { metrics, log: (l) => logs.push(l) });
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, gate.handler(echo));
  gate.start(server.addr.port);
  return {
    port: listener.addr.port,
    gate,
    metrics,
    logs,
    close: async () => {
      await gate.close();
      await server.shutdown();
    },
  };
}

/** Everything the server sends until it closes (fails the test if it is still open after 5 s). */
async function readToClose(conn: Deno.Conn): Promise<string> {
  const chunks: string[] = [];
  const buf = new Uint8Array(65536);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const stuck = new Promise<"stuck">((r) => timer = setTimeout(() => r("stuck"), 5000));
  try {
    for (;;) {
      const n = await Promise.race([conn.read(buf).catch(() => null), stuck]);
      if (n === "stuck") assert.fail(`connection still open after 5 s; got ${chunks.join("")}`);
      if (n === null) return chunks.join("");
      chunks.push(dec.decode(buf.subarray(0, n)));
    }
  } finally {
    clearTimeout(timer);
    conn.close();
  }
}

/** Reads one response of `Content-Length` framing from a kept-alive connection. */
async function readResponse(conn: Deno.Conn): Promise<string> {
  let text = "";
  const buf = new Uint8Array(65536);
  for (;;) {
    const n = await conn.read(buf);
    if (n === null) throw new Error(`closed after ${JSON.stringify(text)}`);
    text += dec.decode(buf.subarray(0, n));
    const end = text.indexOf("\r\n\r\n");
    if (end < 0) continue;
    const len = Number(/content-length: (\d+)/i.exec(text.slice(0, end))?.[1] ?? 0);
    if (text.length >= end + 4 + len) return text;
  }
}

const get = "GET / HTTP/1.1\r\nhost: x\r\n\r\n";

Deno.test("ConnectionGate closes a connection that stays idle, fresh or kept alive", async () => {
  const s = start({ idleTimeoutMs: 200 });
  try {
    const fresh = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
    const kept = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
    await kept.write(enc.encode(get));
    assert.match(await readResponse(kept), /^HTTP\/1.1 200/);
    assert.equal(await readToClose(fresh), "");
    assert.equal(await readToClose(kept), "");
    assert.equal(s.metrics.connectionsTimedOut.get({ reason: "idle" }), 2);
  } finally {
    await s.close();
  }
});

Deno.test("ConnectionGate answers 408 and closes a request head that does not complete in time, even one trickling bytes", async () => {
  const s = start({ headTimeoutMs: 300, idleTimeoutMs: 10_000 });
  try {
    const partial = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
    await partial.write(enc.encode("GET / HTTP/1.1\r\nhost: x\r\n"));
    const trickle = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
    const head = "GET / HTTP/1.1\r\nhost: x\r\nx-a: " + "a".repeat(200);
    let stop = false;
    const trickling = (async () => {
      for (let i = 0; i < head.length && !stop; i++) {
        await trickle.write(enc.encode(head[i])).catch(() => stop = true);
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    for (const conn of [partial, trickle]) {
      const got = await readToClose(conn);
      assert.match(got, /^HTTP\/1.1 408 /);
      const body = JSON.parse(got.slice(got.indexOf("\r\n\r\n") + 4));
      assert.equal(body.error.type, "timeout_error");
      assert.equal(body.error.param, "headers");
    }
    stop = true;
    await trickling;
    assert.equal(s.metrics.connectionsTimedOut.get({ reason: "head" }), 2);
  } finally {
    await s.close();
  }
});

Deno.test("ConnectionGate refuses the connection above the cap while the first ones are answered", async () => {
  const s = start({ maxConnections: 2 });
  try {
    const a = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
    const b = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
    while (s.gate.open < 2) await new Promise((r) => setTimeout(r, 5));
    const c = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
    const refused = await readToClose(c);
    assert.match(refused, /^HTTP\/1.1 503 /);
    assert.match(refused, /retry-after: 1/i);
    assert.match(refused, /server\.max_connections 2/);
    for (const conn of [a, b]) {
      await conn.write(enc.encode(get));
      assert.match(await readResponse(conn), /^HTTP\/1.1 200[^]*ok$/);
      conn.close();
    }
    assert.equal(s.metrics.connectionsRefused.get({ reason: "limit" }), 1);
    // A slot frees when a connection closes.
    while (s.gate.open > 0) await new Promise((r) => setTimeout(r, 5));
    const res = await fetch(`http://127.0.0.1:${s.port}/`);
    assert.equal(await res.text(), "ok");
  } finally {
    await s.close();
  }
});

Deno.test("ConnectionGate keeps serving after accept fails (EMFILE), logging once per burst", async () => {
  let failures = 3;
  const s = start({}, (l) => ({
    accept: () => {
      if (failures-- > 0) {
        return Promise.reject(new Error("Too many open files (os error 24)"));
      }
      return l.accept();
    },
    close: () => l.close(),
  }));
  try {
    const res = await fetch(`http://127.0.0.1:${s.port}/`);
    assert.equal(await res.text(), "ok");
    assert.equal(s.metrics.acceptErrors.get(), 3);
    assert.equal(s.logs.filter((l) => l.includes("Too many open files")).length, 1);
    assert.ok(s.logs.some((l) => l.includes("accepting again after 3 failed accepts")));
  } finally {
    await s.close();
  }
});

Deno.test("ConnectionGate answers a chunked body Deno.serve drops unanswered with a JSON 400 naming body", async () => {
  const s = start();
  try {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
    await conn.write(enc.encode(
      "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\nbad\r\n0\r\n\r\n",
    ));
    const got = await readToClose(conn);
    assert.match(got, /^HTTP\/1.1 400 /);
    const body = JSON.parse(got.slice(got.indexOf("\r\n\r\n") + 4));
    assert.equal(body.error.param, "body");
  } finally {
    await s.close();
  }
});

Deno.test("ConnectionGate drain: a body in flight completes, idle connections close, new ones are refused", async () => {
  const s = start();
  try {
    const idle = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
    const upload = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
    await upload.write(enc.encode("POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nhello"));
    while (s.gate.open < 2) await new Promise((r) => setTimeout(r, 5));
    // The request reaches the app before the drain begins.
    await new Promise((r) => setTimeout(r, 100));
    s.gate.drain();
    const settled = s.gate.settled();
    assert.equal(await readToClose(idle), "");
    await assert.rejects(Deno.connect({ hostname: "127.0.0.1", port: s.port }));
    await new Promise((r) => setTimeout(r, 300));
    await upload.write(enc.encode("world"));
    const got = await readToClose(upload);
    assert.match(got, /^HTTP\/1.1 200 [^]*\{"n":10\}$/);
    await settled;
  } finally {
    await s.close();
  }
});

Deno.test("ConnectionGate drain: a request unanswered when the grace ends gets 503 shutting_down with Retry-After", async () => {
  const s = start();
  try {
    const upload = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
    await upload.write(enc.encode("POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nhello"));
    await new Promise((r) => setTimeout(r, 100));
    s.gate.drain();
    s.gate.expire();
    const got = await readToClose(upload);
    assert.match(got, /^HTTP\/1.1 503 /);
    assert.match(got, /retry-after: 1/i);
    assert.match(got, /"message":"server is shutting down"/);
  } finally {
    await s.close();
  }
});

Deno.test("ConnectionGate relays new connections to a restarted Deno.serve after start(newPort)", async () => {
  const s = start();
  const again = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    s.gate.handler(() => new Response("again")),
  );
  try {
    assert.equal(await (await fetch(`http://127.0.0.1:${s.port}/`)).text(), "ok");
    s.gate.start(again.addr.port);
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
    await conn.write(enc.encode("GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"));
    assert.match(await readToClose(conn), /^HTTP\/1.1 200 [^]*again$/);
  } finally {
    await s.close();
    await again.shutdown();
  }
});

Deno.test("connectionCap() keeps three descriptors a connection below the open-file limit", () => {
  assert.deepEqual(connectionCap(undefined, 20000), { cap: 6581, lowered: null });
  assert.deepEqual(connectionCap(100, 20000), { cap: 100, lowered: null });
  const big = connectionCap(50_000, 1024);
  assert.equal(big.cap, 256);
  assert.match(big.lowered!, /server\.max_connections 50000 lowered to 256/);
  assert.deepEqual(connectionCap(undefined, null), { cap: 4096, lowered: null });
});
