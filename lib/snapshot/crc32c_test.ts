// Tests of CRC32C against published check values (RFC 3720 B.4, the "123456789" check) and a
// bit-at-a-time reference implementation written here.

import assert from "node:assert/strict";
import { crc32c, crc32cUpdate } from "./crc32c.ts";

function bitwise(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
  }
  return (c ^ 0xffffffff) >>> 0;
}

Deno.test("`crc32c()` matches the RFC 3720 and standard check values", () => {
  assert.equal(crc32c(new TextEncoder().encode("123456789")), 0xe3069283);
  assert.equal(crc32c(new Uint8Array(32)), 0x8a9136aa);
  assert.equal(crc32c(new Uint8Array(32).fill(0xff)), 0x62a8ab43);
  assert.equal(crc32c(Uint8Array.from({ length: 32 }, (_, i) => i)), 0x46dd794e);
  assert.equal(crc32c(Uint8Array.from({ length: 32 }, (_, i) => 31 - i)), 0x113fdb5c);
  assert.equal(crc32c(new Uint8Array(0)), 0);
});

Deno.test("`crc32cUpdate()` equals the bitwise reference for any split of random data", () => {
  const data = Uint8Array.from({ length: 1000 }, (_, i) => (i * 7919 + (i >> 3)) & 0xff);
  for (const n of [0, 1, 7, 8, 9, 63, 64, 999, 1000]) {
    const a = data.subarray(0, n);
    assert.equal(crc32c(a), bitwise(a));
    for (const split of [0, 1, 3, Math.floor(n / 2)]) {
      if (split > n) continue;
      assert.equal(crc32cUpdate(a.subarray(split), crc32c(a.subarray(0, split))), bitwise(a));
    }
  }
});
