// Tests of StopStringMatcher: hand-worked cases, and random texts cut into random chunks checked
// against the plain definition (output = text up to the earliest stop occurrence).

import { assert, assertEquals, assertThrows } from "../tokenizer/_assert.ts";
import { StopStringMatcher } from "./stop_strings.ts";
import { Xoshiro128 } from "./prng.ts";

function run(stops: string[], chunks: string[]) {
  const m = new StopStringMatcher(stops);
  const emitted: string[] = [];
  let stoppedAt = -1;
  chunks.forEach((c, i) => {
    const step = m.push(c);
    emitted.push(step.emit);
    if (step.stopped && stoppedAt < 0) stoppedAt = i;
  });
  if (stoppedAt < 0) emitted.push(m.flush());
  return { emitted, stoppedAt };
}

Deno.test("`StopStringMatcher.push()` cuts before the stop string when it arrives in one piece", () => {
  const r = run(["END"], ["Hello END world"]);
  assertEquals(r.emitted, ["Hello "]);
  assertEquals(r.stoppedAt, 0);
});

Deno.test("`StopStringMatcher.push()` holds back a possible stop prefix across chunks", () => {
  const r = run(["END"], ["He", "llo E", "N", "D more"]);
  assertEquals(r.emitted, ["He", "llo ", "", ""]);
  assertEquals(r.stoppedAt, 3);
});

Deno.test("`StopStringMatcher.push()` releases a false start when the next text breaks it", () => {
  const r = run(["END"], ["E", "N", "X", "!"]);
  assertEquals(r.emitted, ["", "", "ENX", "!", ""]);
  assertEquals(r.stoppedAt, -1);
});

Deno.test("`StopStringMatcher.push()` cuts at the first stop string to complete among several", () => {
  assertEquals(run(["world", "lo w"], ["Hello world"]).emitted, ["Hel"]);
  // "c\nc" starts first but "\n" completes first: generation stops at the newline.
  assertEquals(run(["c\nc", "\n"], ["bc\nc"]).emitted, ["bc"]);
  assertEquals(run(["c\nc", "\n"], ["bc", "\n", "c"]).emitted, ["b", "c", ""]);
  assertEquals(run(["aab"], ["a", "a", "a", "b"]).emitted, ["", "", "a", ""]);
  assertEquals(run(["\n\n"], ["line one\n", "\nline two"]).emitted, ["line one", ""]);
});

Deno.test("`StopStringMatcher.flush()` returns held text when no stop string completes", () => {
  const m = new StopStringMatcher(["STOP"]);
  assertEquals(m.push("the ST").emit, "the ");
  assertEquals(m.pending, "ST");
  assertEquals(m.flush(), "ST");
  assertThrows(() => new StopStringMatcher([""]), TypeError, "stop string #0");
});

Deno.test("`StopStringMatcher` output equals the text up to the first stop occurrence for random chunkings", () => {
  const g = new Xoshiro128(99);
  const pick = (n: number) => Math.floor(g.nextFloat() * n);
  const alphabet = "ab\nc";
  for (let trial = 0; trial < 3000; trial++) {
    const text = Array.from({ length: 1 + pick(30) }, () => alphabet[pick(alphabet.length)]).join(
      "",
    );
    const stops = Array.from(
      { length: 1 + pick(3) },
      () => Array.from({ length: 1 + pick(4) }, () => alphabet[pick(alphabet.length)]).join(""),
    );
    const chunks: string[] = [];
    for (let i = 0; i < text.length;) {
      const len = 1 + pick(4);
      chunks.push(text.slice(i, i + len));
      i += len;
    }
    // Oracle, read one character at a time: the first end position where some stop string
    // ends; cut at the start of the longest stop string ending there.
    let cut = text.length;
    search: for (let e = 1; e <= text.length; e++) {
      for (const s of [...stops].sort((a, b) => b.length - a.length)) {
        if (e >= s.length && text.slice(e - s.length, e) === s) {
          cut = e - s.length;
          break search;
        }
      }
    }
    const r = run(stops, chunks);
    const ctx = JSON.stringify({ text, stops, chunks });
    assertEquals(r.emitted.join(""), text.slice(0, cut), ctx);
    assertEquals(r.stoppedAt >= 0, cut < text.length, ctx);
    // Nothing was emitted before it was certain: every emitted prefix is a prefix of the answer.
    let soFar = "";
    for (const e of r.emitted) {
      soFar += e;
      assert(text.slice(0, cut).startsWith(soFar), ctx);
    }
  }
});
