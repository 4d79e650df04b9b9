// Tests of ModelQueue against worked sequences: slots up to concurrency, FIFO waiters up to depth,
// refusal beyond with a Retry-After, aborted waiters leaving the line.
import assert from "node:assert/strict";
import { ModelQueue, QueueFullError } from "./queue.ts";

Deno.test("ModelQueue admits `concurrency` at once, queues `depth`, refuses the next with QueueFullError", async () => {
  const seen: [number, number][] = [];
  const q = new ModelQueue("t", 2, 1, (r, w) => seen.push([r, w]));
  const a = await q.acquire();
  const b = await q.acquire();
  let cGot = false;
  const c = q.acquire().then((rel) => {
    cGot = true;
    return rel;
  });
  await assert.rejects(
    q.acquire(),
    (e: unknown) => e instanceof QueueFullError && e.retryAfterS >= 1 && /"t"/.test(e.message),
  );
  assert.equal(q.waiting, 1);
  a();
  a(); // idempotent
  const cr = await c;
  assert.equal(cGot, true);
  assert.equal(q.running, 2);
  b();
  cr();
  assert.equal(q.running, 0);
  assert.deepEqual(seen.at(-1), [0, 0]);
});

Deno.test("ModelQueue drops a waiter whose signal aborts; its promise rejects", async () => {
  const q = new ModelQueue("t", 1, 2);
  const hold = await q.acquire();
  const ac = new AbortController();
  const waiting = q.acquire(ac.signal);
  assert.equal(q.waiting, 1);
  ac.abort(new Error("gone"));
  await assert.rejects(waiting, /gone/);
  assert.equal(q.waiting, 0);
  hold();
  assert.equal(q.running, 0);
  assert.throws(() => new ModelQueue("t", 0, 1), RangeError);
});
