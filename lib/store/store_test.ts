// Tests of the shared store helpers: key validation, TTL/budget checks, content addressing.
// Known answers for SHA-256 are the FIPS 180-2 test vectors.

import assert from "node:assert/strict";
import { contentKey, MAX_KEY_LENGTH, StoreError, validateKey, validateTtl } from "./store.ts";

Deno.test("`contentKey()` returns the FIPS 180-2 SHA-256 hex when given known vectors", async () => {
  assert.equal(
    await contentKey(new Uint8Array(0)),
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
  );
  assert.equal(
    await contentKey(new TextEncoder().encode("abc")),
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
  );
  // a subarray hashes only its own bytes
  const big = new TextEncoder().encode("xxabcxx");
  assert.equal(
    await contentKey(big.subarray(2, 5)),
    await contentKey(new TextEncoder().encode("abc")),
  );
  // deno-lint-ignore no-explicit-any
  await assert.rejects(contentKey("abc" as any), TypeError);
});

Deno.test("`validateKey()` accepts safe names and rejects others with values quoted", () => {
  for (const k of ["a", "A-z_0.9:x", "x".repeat(MAX_KEY_LENGTH), "e3b0c442", "p:1:2"]) {
    validateKey(k);
  }
  assert.throws(() => validateKey(""), RangeError);
  assert.throws(() => validateKey("x".repeat(MAX_KEY_LENGTH + 1)), /201 characters/);
  for (const k of ["a/b", "..", ".", ".tmp-1", "a b", "a\nb", "é", "a*b", "a\\b"]) {
    assert.throws(
      () => validateKey(k),
      (e) => e instanceof RangeError && e.message.includes(JSON.stringify(k)),
      k,
    );
  }
  assert.throws(() => validateKey(5), TypeError);
  assert.throws(() => validateKey(undefined), TypeError);
});

Deno.test("`validateTtl()` accepts 1..2^31-1 integers and rejects others", () => {
  assert.equal(validateTtl(undefined), undefined);
  assert.equal(validateTtl(1), 1);
  assert.equal(validateTtl(2 ** 31 - 1), 2 ** 31 - 1);
  for (const v of [0, -1, 0.5, Infinity, NaN, "5", 2 ** 31]) {
    assert.throws(() => validateTtl(v), RangeError, String(v));
  }
});

Deno.test("`StoreError` carries kind and store when constructed", () => {
  const e = new StoreError("too_large", "fs", "big", { cause: new Error("x") });
  assert.ok(e instanceof Error);
  assert.equal(e.name, "StoreError");
  assert.equal(e.kind, "too_large");
  assert.equal(e.store, "fs");
  assert.equal((e.cause as Error).message, "x");
});
