// Limits on request and response bodies beyond the upload tests: a JSON body nested thousands
// deep is a 400 on every POST route (never a 500 from a stack overflow), the lone-surrogate walk
// is iterative, and — over a real socket — a snapshot download its client does not read is
// aborted at the request deadline, freeing the tier's sequence and slot.
import assert from "node:assert/strict";
import { registerDecode } from "../decode/app.ts";
import { registerGenerate } from "../generate/app.ts";
import { registerMigrate } from "../migrate/app.ts";
import { registerPrefill } from "../prefill/app.ts";
import { createBaseApp } from "./app.ts";
import { illFormedPath, jsonDepth } from "./body.ts";
import { metricValue, post, testRuntime } from "./test_helpers.ts";
import type { Runtime } from "../../lib/serve/mod.ts";

function allApp(rt: Runtime) {
  const app = createBaseApp(rt, "all");
  registerGenerate(app, rt);
  registerPrefill(app, rt);
  registerMigrate(app, rt);
  registerDecode(app, rt);
  return app;
}

Deno.test("the lone-surrogate walk and the depth count are iterative: 200,000 levels do not overflow the stack", () => {
  const n = 200_000;
  const deepArray = JSON.parse("[".repeat(n) + '"\\ud800"' + "]".repeat(n));
  const bad = illFormedPath(deepArray);
  assert.ok(bad);
  assert.equal(bad.length, n);
  assert.ok(bad.every((k) => k === "0"));
  const deepObject = JSON.parse('{"a":'.repeat(n) + '"ok"' + "}".repeat(n));
  assert.equal(illFormedPath(deepObject), null);
  assert.equal(jsonDepth(deepObject, 64), 65, "counting stops past the limit");
  assert.equal(jsonDepth({ a: [1, { b: [] }] }, 64), 4);
  assert.deepEqual(illFormedPath({ a: ["ok", { "b\ud800": 1 }] }), ["a", "1", "b\ud800"]);
  assert.deepEqual(illFormedPath({ a: "ok", b: ["x", "\udc00"] }), ["b", "1"]);
});

Deno.test("a JSON body nested 5,000 deep is a 400 on every POST route, never a 500", async () => {
  const rt = await testRuntime({ config: { server: { max_body_bytes: 1 << 20 } } });
  try {
    const app = allApp(rt);
    const depth = 5000;
    const bodies = {
      arrays: "[".repeat(depth) + "]".repeat(depth),
      objects: '{"a":'.repeat(depth) + "1" + "}".repeat(depth),
      "under a field": '{"tools": ' + "[".repeat(depth) + "]".repeat(depth) + "}",
    };
    for (
      const url of [
        "/v1/generate",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/prefill",
        "/v1/migrate",
        "/v1/decode",
      ]
    ) {
      for (const [shape, raw] of Object.entries(bodies)) {
        const res = await app.request(url, post(null, {}, raw));
        const what = `${url}, ${shape}`;
        assert.equal(res.status, 400, what);
        const err = (await res.json()).error;
        assert.equal(err.type, "invalid_request_error", what);
        assert.equal(err.param, "body", what);
        assert.match(err.message, /nests arrays and objects more than 64 deep/, what);
      }
    }
  } finally {
    await rt.close();
  }
});

/** Sends a raw HTTP/1.1 request and reads only the response head, then nothing more. */
async function requestThenStopReading(
  port: number,
  path: string,
  body: string,
): Promise<{ conn: Deno.Conn; head: string }> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const bytes = new TextEncoder().encode(body);
  await conn.write(
    new TextEncoder().encode(
      `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${bytes.length}\r\n\r\n`,
    ),
  );
  await conn.write(bytes);
  const buf = new Uint8Array(4096);
  const n = await conn.read(buf);
  return { conn, head: new TextDecoder().decode(buf.subarray(0, n ?? 0)) };
}

async function waitFor(what: string, ms: number, ok: () => Promise<boolean>) {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    if (await ok()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.fail(`${what}: not within ${ms} ms`);
}

Deno.test("a snapshot download its client does not read is aborted at the request deadline: the sequence and slot are freed", async () => {
  const deadlineMs = 6000;
  const rt = await testRuntime({
    tiers: { powerful: "tiny-powerful" },
    tier: { max_context: 2048, concurrency: 1, request_timeout_ms: deadlineMs },
  });
  const app = allApp(rt);
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, app.fetch);
  const metrics = async () =>
    await (await fetch(`http://127.0.0.1:${server.addr.port}/metrics`)).text();
  let conn: Deno.Conn | undefined;
  const active = async () =>
    metricValue(await metrics(), 'kvrelay_active_sequences{tier="powerful"}');
  try {
    // ~16 MB of snapshot: more than the socket buffers between server and client hold.
    const tokens = Array.from({ length: 2000 }, (_, i) => 5 + (i % 200));
    const t0 = performance.now();
    const sent = await requestThenStopReading(
      server.addr.port,
      "/v1/prefill",
      JSON.stringify({ tier: "powerful", tokens }),
    );
    conn = sent.conn;
    assert.match(sent.head, /^HTTP\/1\.1 200/);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(await active(), 1, "the download is in progress, held by its unread socket");
    await waitFor("the sequence freed", deadlineMs + 5000, async () => (await active()) === 0);
    assert.ok(performance.now() - t0 >= deadlineMs - 100, "not before the deadline");
    const m = await metrics();
    assert.equal(metricValue(m, 'kvrelay_write_timeouts_total{body="snapshot"}'), 1);
    // The tier's one slot is free again: an ordinary request on it is served.
    const res = await fetch(`http://127.0.0.1:${server.addr.port}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "powerful", prompt: "hello", max_tokens: 2 }),
    });
    assert.equal(res.status, 200);
    await res.arrayBuffer();
    // The client gets the bytes that were in flight, then the connection ends short of the body.
    let got = 0;
    const buf = new Uint8Array(1 << 16);
    try {
      for (;;) {
        const n = await conn.read(buf);
        if (n === null) break;
        got += n;
      }
    } catch {
      // reset by the server: also an end
    }
    const whole = await fetch(`http://127.0.0.1:${server.addr.port}/v1/prefill`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ tier: "powerful", tokens }),
    });
    const size = (await whole.arrayBuffer()).byteLength;
    assert.ok(got < size, `read ${got} of ${size} bytes: the body was cut`);
  } finally {
    try {
      conn?.close();
    } catch {
      // already closed
    }
    await server.shutdown();
    await rt.close();
  }
});
