// Tests of the SSE helper on its own (a bare Hono app): the exact bytes of OpenAI's framing, the
// error frame, headers, and what a client that goes away does to the producer.
import assert from "node:assert/strict";
import { Hono } from "hono";
import { sseResponse } from "./sse.ts";

Deno.test("sseResponse writes `data: <json>` frames then `data: [DONE]`, byte for byte", async () => {
  const app = new Hono();
  const frames = [{ a: 1 }, { text: 'é\n"x"' }, { choices: [] }];
  app.get("/", (c) => {
    c.header("x-kept", "1");
    return sseResponse(
      c,
      async (send) => {
        for (const f of frames) {
          send(f);
          await new Promise((r) => setTimeout(r, 1));
        }
      },
      () => {},
      () => ({}),
    );
  });
  const res = await app.request("/");
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("content-type"), "text/event-stream; charset=utf-8");
  assert.equal(res.headers.get("cache-control"), "no-cache");
  assert.equal(res.headers.get("x-accel-buffering"), "no");
  assert.equal(res.headers.get("x-kept"), "1");
  assert.equal(res.headers.get("transfer-encoding"), null);
  assert.equal(res.headers.get("connection"), null);
  // The oracle: OpenAI's wire format built by hand.
  const want = frames.map((f) => `data: ${JSON.stringify(f)}\n\n`).join("") + "data: [DONE]\n\n";
  assert.equal(await res.text(), want);
});

Deno.test("sseResponse keeps the order of frames sent in one tick", async () => {
  const app = new Hono();
  app.get("/", (c) =>
    sseResponse(
      c,
      async (send) => {
        for (let i = 0; i < 200; i++) send({ i });
        await Promise.resolve();
      },
      () => {},
      () => ({}),
    ));
  const text = await (await app.request("/")).text();
  const got = text.split("\n\n").filter(Boolean);
  assert.equal(got.length, 201);
  got.slice(0, 200).forEach((f, i) => assert.equal(f, `data: {"i":${i}}`));
  assert.equal(got[200], "data: [DONE]");
});

Deno.test("sseResponse turns a thrown error into one error frame before [DONE]", async () => {
  const app = new Hono();
  app.get("/", (c) =>
    sseResponse(
      c,
      async (send) => {
        send({ text: "a" });
        await Promise.resolve();
        throw new Error("boom");
      },
      () => {},
      (e) => ({ error: { message: (e as Error).message } }),
    ));
  const text = await (await app.request("/")).text();
  assert.equal(
    text,
    'data: {"text":"a"}\n\ndata: {"error":{"message":"boom"}}\n\ndata: [DONE]\n\n',
  );
});

Deno.test("sseResponse calls onCancel once when the client cancels, and stops writing", async () => {
  const app = new Hono();
  let cancels = 0;
  let sentAfterCancel = 0;
  let finished!: () => void;
  const done = new Promise<void>((r) => finished = r);
  app.get("/", (c) => {
    const ac = new AbortController();
    return sseResponse(c, async (send) => {
      send({ first: true });
      while (!ac.signal.aborted) await new Promise((r) => setTimeout(r, 2));
      send({ late: true });
      sentAfterCancel++;
      finished();
    }, () => {
      cancels++;
      ac.abort();
    }, () => ({}));
  });
  const res = await app.request("/");
  const reader = res.body!.getReader();
  const first = await reader.read();
  assert.equal(new TextDecoder().decode(first.value), 'data: {"first":true}\n\n');
  await reader.cancel();
  await done;
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(cancels, 1);
  assert.equal(sentAfterCancel, 1); // the producer ran to its end (it saw the abort) without throwing
});

Deno.test("sseResponse: a client that does not read does not stall the producer", async () => {
  const app = new Hono();
  let produced = 0;
  let finished!: () => void;
  const done = new Promise<void>((r) => finished = r);
  app.get("/", (c) =>
    sseResponse(
      c,
      async (send) => {
        for (let i = 0; i < 500; i++) {
          send({ i, pad: "x".repeat(1000) });
          produced++;
          if (i % 50 === 0) await new Promise((r) => setTimeout(r, 0));
        }
        finished();
      },
      () => {},
      () => ({}),
    ));
  const res = await app.request("/"); // body never read until the producer is done
  await done;
  assert.equal(produced, 500);
  const got = (await res.text()).split("\n\n").filter(Boolean);
  assert.equal(got.length, 501);
});
