// mulberry32: a tiny seeded uint32 PRNG for tests and fixture generators (deterministic data).
// Not the sampler's generator (lib/engine/prng.ts, xoshiro128**) and not for anything secret.

/**
 * A deterministic PRNG.
 * @param seed any number (its low 32 bits are used)
 * @returns a function giving floats in [0, 1)
 */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
