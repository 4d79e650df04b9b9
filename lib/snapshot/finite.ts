// KV values a snapshot may carry: finite in the stored dtype and still finite once converted to
// the importing cache's dtype (f32 1e38 becomes +Inf in an f16 cache). A NaN or Inf in a cache
// poisons every later logit, so decoding refuses it as a malformed snapshot before import.
import { SnapshotError } from "./errors.ts";
import type { CacheDtype } from "./format.ts";

const F16_OVERFLOW = 65520; // |x| ≥ this rounds (to nearest even) to ±Inf in f16

/** Largest-magnitude check per destination: true when a finite f32 value overflows it. */
function overflows(x: number, into: CacheDtype, u32: number): boolean {
  if (into === "f16") return Math.abs(x) >= F16_OVERFLOW;
  if (into === "bf16") {
    // Round-to-nearest-even of the upper 16 bits, as the converter does: exponent all ones → Inf.
    const r = (u32 + 0x7fff + ((u32 >>> 16) & 1)) >>> 0;
    return ((r >>> 23) & 0xff) === 0xff;
  }
  return false;
}

/**
 * Refuses a decoded K or V block holding a value that is not finite in its stored dtype or that
 * overflows the cache dtype it is written into.
 * @param bytes the block (its own dtype, little-endian; aligned copies from the chunk decoder)
 * @param dtype the block's dtype
 * @param into the importing cache's dtype (default: the block's own)
 * @param what names the block in the error, e.g. "chunk 0 layer 3 K"
 * @throws {SnapshotError} kind "format" quoting the first offending element
 */
export function checkFiniteKv(
  bytes: Uint8Array,
  dtype: CacheDtype,
  into: CacheDtype = dtype,
  what = "KV",
): void {
  const fail = (i: number, v: number | string) => {
    throw new SnapshotError(
      "format",
      `${what}: element ${i} is ${v}${
        typeof v === "number" && Number.isFinite(v) ? `, which overflows the ${into} cache` : ""
      }; KV values must be finite`,
    );
  };
  if (dtype === "f32") {
    const f = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 2);
    const u = new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 2);
    for (let i = 0; i < f.length; i++) {
      const x = f[i];
      if (x - x !== 0) fail(i, x); // NaN or ±Inf
      if (into !== "f32" && overflows(x, into, u[i])) fail(i, x);
    }
    return;
  }
  const h = new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 1);
  if (dtype === "f16") {
    for (let i = 0; i < h.length; i++) if ((h[i] & 0x7c00) === 0x7c00) fail(i, "Inf or NaN");
    return; // every finite f16 fits f32 and bf16
  }
  // bf16
  const u = new Uint32Array(1);
  const f = new Float32Array(u.buffer);
  for (let i = 0; i < h.length; i++) {
    if ((h[i] & 0x7f80) === 0x7f80) fail(i, "Inf or NaN");
    if (into === "f16") {
      u[0] = h[i] << 16;
      if (Math.abs(f[0]) >= F16_OVERFLOW) fail(i, f[0]);
    }
  }
}
