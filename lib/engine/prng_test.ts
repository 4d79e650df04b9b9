// Tests of the xoshiro128** generator against the reference C implementation's outputs
// (state {1, 2, 3, 4}, computed with Blackman & Vigna's next()), and of its seeding.

import { assert, assertEquals, assertNotEquals, assertThrows } from "../tokenizer/_assert.ts";
import { Xoshiro128 } from "./prng.ts";

Deno.test("`Xoshiro128.nextUint32()` matches the reference xoshiro128** outputs when the state is {1,2,3,4}", () => {
  const g = Xoshiro128.fromState([1, 2, 3, 4]);
  const out = Array.from({ length: 6 }, () => g.nextUint32());
  assertEquals(out, [11520, 0, 5927040, 70819200, 2031721883, 1637235492]);
});

Deno.test("`Xoshiro128` repeats a stream for one seed and differs between seeds", () => {
  const a = new Xoshiro128(42),
    b = new Xoshiro128(42),
    c = new Xoshiro128(43),
    d = new Xoshiro128(42 + 2 ** 32);
  const take = (g: Xoshiro128) => Array.from({ length: 8 }, () => g.nextUint32());
  const sa = take(a);
  assertEquals(take(b), sa);
  assertNotEquals(take(c), sa);
  assertNotEquals(take(d), sa); // the high 32 bits of the seed count
  assertThrows(() => new Xoshiro128(1.5), RangeError, "1.5");
  assertThrows(() => Xoshiro128.fromState([0, 0, 0, 0]), RangeError, "zero");
});

Deno.test("`Xoshiro128.nextFloat()` stays in [0, 1) with mean 1/2 and variance 1/12 over 100k draws", () => {
  const g = new Xoshiro128(7);
  const n = 100_000;
  let sum = 0, sumSq = 0;
  for (let i = 0; i < n; i++) {
    const u = g.nextFloat();
    assert(u >= 0 && u < 1, `draw ${u} outside [0, 1)`);
    sum += u;
    sumSq += u * u;
  }
  const mean = sum / n;
  const variance = sumSq / n - mean * mean;
  assert(Math.abs(mean - 0.5) < 0.005, `mean ${mean}`);
  assert(Math.abs(variance - 1 / 12) < 0.002, `variance ${variance}`);
});
