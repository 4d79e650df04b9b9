// End-to-end: the connection lifecycle of the real `functions/main.ts` process over raw sockets —
// a broken chunked body answered with a JSON 400, idle and stalled-head connections closed by
// their timeouts, the connection cap, the /metrics counters, more connections than the open-file
// limit allows, and SIGTERM while uploads are in flight (answered, or 503 shutting_down with
// Retry-After; never a 4xx).
import assert from "node:assert/strict";
import { metricValue } from "../functions/shared/test_helpers.ts";
import { startServer, writeConfig } from "./e2e_support.ts";

const enc = new TextEncoder();
const dec = new TextDecoder();

/** Everything the server sends until it closes (fails if it is still open after `ms`). */
async function readToClose(conn: Deno.Conn, ms = 10_000): Promise<string> {
  let text = "";
  const buf = new Uint8Array(65536);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const stuck = new Promise<"stuck">((r) => timer = setTimeout(() => r("stuck"), ms));
  try {
    for (;;) {
      const n = await Promise.race([conn.read(buf).catch(() => null), stuck]);
      if (n === "stuck") assert.fail(`connection still open after ${ms} ms; got ${text}`);
      if (n === null) return text;
      text += dec.decode(buf.subarray(0, n));
    }
  } finally {
    clearTimeout(timer);
    try {
      conn.close();
    } catch {
      // closed
    }
  }
}

function parse(raw: string): { status: number; headers: string; body: string } {
  const end = raw.indexOf("\r\n\r\n");
  return {
    status: Number(raw.slice(9, 12)),
    headers: raw.slice(0, end).toLowerCase(),
    body: raw.slice(end + 4),
  };
}

Deno.test("the served process: broken chunked bodies get a JSON 400 naming body; idle and stalled heads time out; the cap refuses the next connection", async () => {
  const config = await writeConfig({ fast: "tiny-fast" }, {}, {
    server: { idle_timeout_ms: 400, head_timeout_ms: 400, max_connections: 3 },
  });
  const server = await startServer("functions/main.ts", { KVRELAY_CONFIG: config });
  const connect = () => Deno.connect({ hostname: "127.0.0.1", port: server.port });
  try {
    // Broken chunk size in the first packet (Deno.serve drops it unanswered) and after the head
    // (the app's body reader sees the error).
    for (const late of [false, true]) {
      const conn = await connect();
      const head =
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" +
        'transfer-encoding: chunked\r\n\r\n2\r\n{"\r\n';
      await conn.write(enc.encode(head + (late ? "" : "ZZ\r\nbad\r\n0\r\n\r\n")));
      if (late) {
        await new Promise((r) => setTimeout(r, 100));
        await conn.write(enc.encode("ZZ\r\nbad\r\n0\r\n\r\n"));
      }
      const res = parse(await readToClose(conn));
      assert.equal(res.status, 400, `late=${late}: ${res.headers}`);
      const body = JSON.parse(res.body);
      assert.equal(body.error.type, "invalid_request_error");
      assert.equal(body.error.param, "body");
    }

    // The readiness poll's kept-alive connection closes by the idle timeout first.
    await new Promise((r) => setTimeout(r, 800));
    const idle = await connect();
    const partial = await connect();
    await partial.write(enc.encode("GET /healthz HTTP/1.1\r\nhost: x\r\n"));
    const third = await connect();
    await new Promise((r) => setTimeout(r, 100)); // all three admitted
    const refused = parse(await readToClose(await connect()));
    assert.equal(refused.status, 503);
    assert.match(refused.headers, /retry-after: 1/);
    await third.write(enc.encode("GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"));
    assert.equal(parse(await readToClose(third)).status, 200);
    assert.equal(await readToClose(idle), "");
    const timedOut = parse(await readToClose(partial));
    assert.equal(timedOut.status, 408);
    assert.equal(JSON.parse(timedOut.body).error.param, "headers");

    const metrics = await (await fetch(`${server.base}/metrics`)).text();
    assert.ok(metricValue(metrics, 'kvrelay_connections_timed_out_total{reason="idle"}') >= 1);
    assert.equal(metricValue(metrics, 'kvrelay_connections_timed_out_total{reason="head"}'), 1);
    assert.equal(metricValue(metrics, 'kvrelay_connections_refused_total{reason="limit"}'), 1);
    assert.equal(metricValue(metrics, "kvrelay_open_connections"), 1); // this fetch's
  } finally {
    const { status, stderr } = await server.stop();
    assert.equal(status.code, 0, stderr);
  }
});

Deno.test("SIGTERM during uploads: one finished within the grace is answered, stalled ones get 503 shutting_down with Retry-After", async () => {
  const config = await writeConfig({ fast: "tiny-fast" }, {}, {
    server: { shutdown_grace_ms: 1500, body_timeout_ms: 60000 },
  });
  const server = await startServer("functions/main.ts", { KVRELAY_CONFIG: config });
  const json = JSON.stringify({ model: "fast", prompt: "The ship", max_tokens: 4 });
  const upload = async (path: string, type: string, first: string, length: number) => {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.port });
    await conn.write(enc.encode(
      `POST ${path} HTTP/1.1\r\nhost: x\r\ncontent-type: ${type}\r\ncontent-length: ${length}\r\n\r\n${first}`,
    ));
    return conn;
  };
  let stopped: ReturnType<typeof server.stop> | null = null;
  try {
    const finishing = await upload(
      "/v1/completions",
      "application/json",
      json.slice(0, 10),
      json.length,
    );
    const stalledJson = await upload(
      "/v1/completions",
      "application/json",
      json.slice(0, 10),
      json.length,
    );
    const stalledSnapshot = await upload(
      "/v1/decode",
      "application/vnd.kvrelay.snapshot",
      "KVRS",
      1 << 20,
    );
    await new Promise((r) => setTimeout(r, 300)); // the requests reach the app
    stopped = server.stop();
    await new Promise((r) => setTimeout(r, 500));
    await finishing.write(enc.encode(json.slice(10)));
    const answers = await Promise.all(
      [finishing, stalledJson, stalledSnapshot].map(async (c) => parse(await readToClose(c))),
    );
    const [done, ...stalled] = answers;
    assert.ok(
      done.status === 200 ||
        (done.status === 503 && /retry-after: 1/.test(done.headers) &&
          JSON.parse(done.body).error.message === "server is shutting down"),
      `finished upload: ${done.status} ${done.body}`,
    );
    for (const s of stalled) {
      assert.equal(s.status, 503, s.body);
      assert.match(s.headers, /retry-after: 1/);
      assert.equal(JSON.parse(s.body).error.message, "server is shutting down");
    }
  } finally {
    const { status, stderr } = await (stopped ?? server.stop());
    assert.equal(status.code, 0, stderr);
  }
});

Deno.test("more connections than the open-file limit allows: the process refuses the excess and keeps serving", async () => {
  const config = await writeConfig({ fast: "tiny-fast" });
  const server = await startServer("functions/main.ts", { KVRELAY_CONFIG: config }, 60_000, 400);
  const conns: Deno.Conn[] = [];
  try {
    for (let i = 0; i < 600; i++) {
      try {
        conns.push(await Deno.connect({ hostname: "127.0.0.1", port: server.port }));
      } catch {
        break; // nothing listens any more: the assertions below say why
      }
    }
    await new Promise((r) => setTimeout(r, 1000)); // the backlog is accepted (or refused)
    for (const c of conns) c.close();
    await new Promise((r) => setTimeout(r, 300));
    const res = await fetch(`${server.base}/healthz`);
    assert.equal(res.status, 200);
    const metrics = await (await fetch(`${server.base}/metrics`)).text();
    assert.ok(metricValue(metrics, 'kvrelay_connections_refused_total{reason="limit"}') > 0);
  } finally {
    const { status, stderr } = await server.stop();
    assert.equal(status.code, 0, stderr);
    assert.doesNotMatch(stderr, /Uncaught/);
  }
});
