// Tests of WaitGate against worked sequences: up to `depth` tickets wait, the next is refused with
// a Retry-After; a ticket stops waiting once started or released (each idempotent).
import assert from "node:assert/strict";
import { QueueFullError } from "./queue.ts";
import { WaitGate } from "./wait_gate.ts";

Deno.test("WaitGate lets `depth` tickets wait and refuses the next; started or released ones leave the line", () => {
  const seen: number[] = [];
  const g = new WaitGate("t", 2, (w) => seen.push(w));
  const a = g.admit();
  const b = g.admit();
  assert.throws(
    () => g.admit(),
    (e: unknown) => e instanceof QueueFullError && e.retryAfterS >= 1 && /"t"/.test(e.message),
  );
  a.start();
  a.start(); // idempotent
  a.release(); // already left: no change
  assert.equal(a.waiting, false);
  assert.equal(g.waiting, 1);
  const c = g.admit(); // a's place
  assert.throws(() => g.admit(), QueueFullError);
  b.release();
  c.start();
  assert.equal(g.waiting, 0);
  assert.deepEqual(seen, [1, 2, 1, 2, 1, 0]);
});

Deno.test("WaitGate with depth 0 still lets one request wait when none does", () => {
  const g = new WaitGate("t", 0);
  const a = g.admit();
  assert.throws(() => g.admit(), QueueFullError);
  a.start();
  g.admit().release();
  assert.equal(g.waiting, 0);
  assert.throws(() => new WaitGate("t", -1), RangeError);
});
