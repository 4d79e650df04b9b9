// writeWithin (response write deadline) and BodyBudget (request-body bytes held), without HTTP:
// a body its consumer is not reading at the deadline is aborted and its source cancelled; a body
// whose consumer is waiting on a late producer may still finish; a finished body is left alone;
// holds charge what they add and give it all back once.
import assert from "node:assert/strict";
import { writeWithin } from "./deadline.ts";
import { BusyError } from "./errors.ts";
import { BodyBudget } from "./uploads.ts";

function source(chunks: number) {
  const state = { cancelled: false, pulled: 0 };
  const stream = new ReadableStream<Uint8Array>({
    pull(ctl) {
      if (state.pulled >= chunks) return ctl.close();
      state.pulled++;
      ctl.enqueue(new Uint8Array(1024));
    },
    cancel() {
      state.cancelled = true;
    },
  }, { highWaterMark: 0 });
  return { stream, state };
}

Deno.test("writeWithin: a body not being read at the deadline is aborted and its source cancelled", async () => {
  const { stream, state } = source(100);
  const deadline = new AbortController();
  let expired = 0;
  let finished = 0;
  const body = writeWithin(stream, deadline.signal, {
    onExpire: () => expired++,
    onFinish: () => finished++,
  });
  const reader = body.getReader();
  await reader.read();
  await reader.read(); // then the consumer stops reading
  deadline.abort();
  await new Promise((r) => setTimeout(r, 0));
  assert.ok(state.cancelled, "the source was cancelled");
  assert.equal(expired, 1);
  assert.equal(finished, 1);
  await assert.rejects(reader.read(), /not taken by the client within the request deadline/);
  assert.ok(state.pulled <= 3, `nothing is read ahead of the consumer (${state.pulled} pulls)`);
});

Deno.test("writeWithin: a consumer waiting on a late producer at the deadline gets the rest", async () => {
  let ctl!: ReadableStreamDefaultController<Uint8Array>;
  const late = new ReadableStream<Uint8Array>({
    start(c) {
      ctl = c;
    },
  }, { highWaterMark: 0 });
  const deadline = new AbortController();
  let expired = 0;
  const body = writeWithin(late, deadline.signal, { onExpire: () => expired++ });
  const reader = body.getReader();
  const pending = reader.read(); // the consumer waits: the producer has nothing yet
  await new Promise((r) => setTimeout(r, 0));
  deadline.abort();
  ctl.enqueue(new TextEncoder().encode("last frame"));
  ctl.close();
  assert.equal(new TextDecoder().decode((await pending).value), "last frame");
  assert.equal((await reader.read()).done, true);
  assert.equal(expired, 0);
});

Deno.test("writeWithin: a consumer that stops reading after the deadline is cut after the grace", async () => {
  let ctl!: ReadableStreamDefaultController<Uint8Array>;
  let cancelled = false;
  const late = new ReadableStream<Uint8Array>({
    start(c) {
      ctl = c;
    },
    cancel() {
      cancelled = true;
    },
  }, { highWaterMark: 0 });
  const deadline = new AbortController();
  const body = writeWithin(late, deadline.signal);
  const reader = body.getReader();
  const pending = reader.read();
  await new Promise((r) => setTimeout(r, 0));
  deadline.abort();
  ctl.enqueue(new Uint8Array(1));
  await pending;
  ctl.enqueue(new Uint8Array(1)); // more is ready, but the consumer never asks again
  await new Promise((r) => setTimeout(r, 1200));
  assert.ok(cancelled, "cut once its grace was spent");
});

Deno.test("writeWithin: a body read to its end is left alone by a later deadline", async () => {
  const { stream, state } = source(3);
  const deadline = new AbortController();
  let expired = 0;
  const body = writeWithin(stream, deadline.signal, { onExpire: () => expired++ });
  assert.equal((await new Response(body).arrayBuffer()).byteLength, 3 * 1024);
  deadline.abort();
  assert.equal(expired, 0);
  assert.equal(state.cancelled, false);
});

Deno.test("BodyBudget: holds are charged what they add, refused past the limit, released once", () => {
  const seen: number[] = [];
  const budget = new BodyBudget(100, "server.max_inflight_upload_bytes", (u) => seen.push(u));
  const a = budget.hold();
  const b = budget.hold();
  a.add(60);
  b.add(30);
  assert.equal(budget.used, 90);
  assert.throws(
    () => b.add(20),
    (e) => e instanceof BusyError && /server\.max_inflight_upload_bytes/.test(e.message),
  );
  assert.equal(budget.used, 90, "a refused charge holds nothing");
  a.release();
  a.release();
  assert.equal(budget.used, 30);
  b.add(70);
  b.release();
  assert.equal(budget.used, 0);
  assert.deepEqual(seen, [60, 90, 30, 100, 0]);
});
