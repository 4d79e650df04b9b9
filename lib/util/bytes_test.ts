// Known-answer tests of lib/util/bytes.ts: concatenation and hex against literal bytes and digests
// written out here (SHA-256 of "abc" from FIPS 180-2, appendix B.1).
import assert from "node:assert/strict";
import { concatBytes, fromHex, hex, sha256 } from "./bytes.ts";

Deno.test("concatBytes() joins its parts in order into a fresh array", () => {
  const a = new Uint8Array([1, 2]), b = new Uint8Array([]), c = new Uint8Array([3, 4, 5]);
  const out = concatBytes([a, b, c]);
  assert.deepEqual([...out], [1, 2, 3, 4, 5]);
  out[0] = 9;
  assert.equal(a[0], 1, "the result shares no memory with its parts");
  assert.deepEqual([...concatBytes([])], []);
  const view = new Uint8Array([7, 8, 9, 10]).subarray(1, 3);
  assert.deepEqual([...concatBytes([view, view])], [8, 9, 8, 9]);
});

Deno.test("sha256() of several parts is the digest of their concatenation (FIPS 180-2 'abc')", async () => {
  const want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  const enc = new TextEncoder();
  assert.equal(hex(await sha256(enc.encode("abc"))), want);
  assert.equal(hex(await sha256(enc.encode("a"), enc.encode(""), enc.encode("bc"))), want);
  assert.deepEqual([...fromHex("00ff10")], [0, 255, 16]);
});

Deno.test("sha256() of an input past the on-thread size (off-thread digest) is the FIPS 180-2 one-million-'a' digest", async () => {
  const a = new Uint8Array(1_000_000).fill(0x61);
  const want = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  assert.equal(hex(await sha256(a)), want);
  // split in parts, one of them past the size alone and together
  assert.equal(hex(await sha256(a.subarray(0, 100), a.subarray(100))), want);
});
