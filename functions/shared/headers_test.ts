// Oversized request headers over a real socket (Deno.serve + the app), byte-exact requests from a
// raw TCP client: the app answers a JSON 431 up to Deno's own HTTP/1 parser limits; past them
// (a head of 64 KiB or more, more than 128 header lines) Deno answers an empty 400 and closes
// before any app code runs — the documented behaviour (docs/http.md "Headers"), pinned here so a
// Deno upgrade that moves it is noticed.
import assert from "node:assert/strict";
import { createBaseApp, MAX_HEADER_BYTES, MAX_HEADER_COUNT } from "./app.ts";
import { testRuntime } from "./test_helpers.ts";

/** Sends `head` on a new connection; returns the status, headers and body of the answer. */
async function raw(port: number, head: string) {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const writing = conn.write(new TextEncoder().encode(head)).catch(() => 0);
  let text = "";
  const buf = new Uint8Array(65536);
  const timer = setTimeout(() => conn.close(), 5000);
  try {
    while (true) {
      const n = await conn.read(buf).catch(() => null);
      if (n === null) break;
      text += new TextDecoder().decode(buf.subarray(0, n));
      const [h, body] = text.split("\r\n\r\n");
      const len = /content-length: (\d+)/i.exec(h ?? "");
      if (body !== undefined && len && new TextEncoder().encode(body).length >= Number(len[1])) {
        break;
      }
    }
  } finally {
    clearTimeout(timer);
    try {
      conn.close();
    } catch { /* closed by the timer */ }
  }
  await writing;
  const [h, body = ""] = text.split("\r\n\r\n");
  const lines = h.split("\r\n");
  const headers = new Map(
    lines.slice(1).map((l) => {
      const i = l.indexOf(":");
      return [l.slice(0, i).toLowerCase(), l.slice(i + 1).trim()] as [string, string];
    }),
  );
  return { status: Number(lines[0].split(" ")[1]), headers, body };
}

const get = (extra: string) => `GET /healthz HTTP/1.1\r\nhost: x\r\n${extra}\r\n`;
const many = (n: number) => Array.from({ length: n }, (_, i) => `x-h${i}: v\r\n`).join("");

Deno.test("oversized headers: JSON 431 from the app up to Deno's parser limits, Deno's empty 400 past them", async () => {
  const rt = await testRuntime();
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    createBaseApp(rt, "all").fetch,
  );
  try {
    const port = server.addr.port;
    const ok = await raw(port, get("x-small: 1\r\n"));
    assert.equal(ok.status, 200);

    // Over the app's byte limit, under Deno's 64 KiB head: JSON 431 naming the field.
    const bytes = await raw(port, get(`x-big: ${"a".repeat(MAX_HEADER_BYTES + 1024)}\r\n`));
    assert.equal(bytes.status, 431);
    assert.equal(JSON.parse(bytes.body).error.param, "headers");
    assert.match(JSON.parse(bytes.body).error.message, /bytes, above the limit of 32768/);
    // Just under Deno's head limit still reaches the app.
    const edge = await raw(port, get(`x-big: ${"a".repeat(63 * 1024)}\r\n`));
    assert.equal(edge.status, 431);

    // Too many fields, each small: JSON 431 up to Deno's 128 lines (host + 127 here).
    for (const n of [MAX_HEADER_COUNT + 1, 127]) {
      const r = await raw(port, get(many(n)));
      assert.equal(r.status, 431, `${n} headers`);
      assert.match(JSON.parse(r.body).error.message, /header fields, above the limit of 100/);
    }
    const fine = await raw(port, get(many(MAX_HEADER_COUNT - 2)));
    assert.equal(fine.status, 200);

    // Past Deno's parser: an empty 400 with connection: close, before the app (documented).
    for (const head of [get(`x-big: ${"a".repeat(64 * 1024)}\r\n`), get(many(128))]) {
      const r = await raw(port, head);
      assert.equal(r.status, 400);
      assert.equal(r.body, "");
      assert.equal(r.headers.get("content-length"), "0");
      assert.equal(r.headers.get("connection"), "close");
    }
  } finally {
    await server.shutdown();
    await rt.close();
  }
});
