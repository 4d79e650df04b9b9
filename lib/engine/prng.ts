// Seeded pseudo-random numbers for sampling: xoshiro128** (Blackman & Vigna) seeded through
// splitmix32, so one integer seed gives one reproducible stream. Not cryptographic.

/** A small, fast, seedable generator of uniform doubles in [0, 1). */
export class Xoshiro128 {
  readonly #s = new Uint32Array(4);

  /**
   * @param seed any safe integer (negative allowed); both 32-bit halves feed the state
   * @throws {RangeError} when seed is not a safe integer
   */
  constructor(seed: number) {
    if (!Number.isSafeInteger(seed)) {
      throw new RangeError(`seed must be a safe integer, got ${seed}`);
    }
    const lo = seed >>> 0;
    const hi = Math.floor(seed / 0x1_0000_0000) >>> 0;
    // splitmix32 over (lo, hi) fills the 128-bit state; it is never all zero.
    let x = (lo ^ Math.imul(hi, 0x9e3779b9)) >>> 0;
    for (let i = 0; i < 4; i++) {
      x = (x + 0x9e3779b9) >>> 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      this.#s[i] = (z ^ (z >>> 16)) >>> 0;
    }
    if ((this.#s[0] | this.#s[1] | this.#s[2] | this.#s[3]) === 0) this.#s[0] = 1;
  }

  /**
   * A generator with an explicit 128-bit state (for known-answer tests against the reference C).
   *
   * @param state four 32-bit words, not all zero
   * @returns the generator
   * @throws {RangeError} when the state is not four uint32 words or is all zero
   */
  static fromState(state: readonly number[]): Xoshiro128 {
    if (
      state.length !== 4 || !state.every((w) => Number.isInteger(w) && w >= 0 && w <= 0xffff_ffff)
    ) {
      throw new RangeError(`state must be four uint32 words, got ${JSON.stringify(state)}`);
    }
    if (state.every((w) => w === 0)) throw new RangeError("state must not be all zero");
    const g = new Xoshiro128(0);
    g.#s.set(state);
    return g;
  }

  /**
   * Next 32 random bits.
   *
   * @returns an integer in [0, 2^32)
   */
  nextUint32(): number {
    const s = this.#s;
    const result = Math.imul(rotl(Math.imul(s[1], 5), 7), 9) >>> 0;
    const t = s[1] << 9;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return result;
  }

  /**
   * Next uniform double with 53 random bits.
   *
   * @returns a number in [0, 1)
   */
  nextFloat(): number {
    const hi = this.nextUint32() >>> 5; // 27 bits
    const lo = this.nextUint32() >>> 6; // 26 bits
    return (hi * 67108864 + lo) / 9007199254740992;
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/**
 * A fresh random seed from the system's cryptographic source, for unseeded sampling.
 *
 * @returns a non-negative safe integer below 2^53
 */
export function randomSeed(): number {
  const w = crypto.getRandomValues(new Uint32Array(2));
  return (w[0] & 0x1f_ffff) * 0x1_0000_0000 + w[1];
}
