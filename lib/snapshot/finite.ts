// KV values a snapshot may carry: finite in the stored dtype, at most KV_MAX_ABS in magnitude, and
// still finite once converted to the importing cache's dtype (f32 1e5 becomes +Inf in an f16
// cache). A NaN or Inf in a cache — or a value so large that attention or the next layer's norm
// overflows — poisons every later logit, so decoding refuses it as a malformed snapshot before
// import. The TypeScript twin of native/src/host/kv_values.cpp (same rule, same messages).
import { SnapshotError } from "./errors.ts";
import type { CacheDtype } from "./format.ts";

/**
 * The largest |K| or |V| an import accepts: 2^24, for every encoding (every finite f16 is within
 * it). Why this bound keeps attention and logits finite: docs/snapshot-format.md "KV value bound".
 */
export const KV_MAX_ABS = 2 ** 24;

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

/** Where a K or V block sits, to name a refused element: chunk (absent for a block that is not
 *  a snapshot's), layer, part, and its shape (kv_heads, tokens, head_dim) starting at absolute
 *  token position `start`. */
export interface KvBlockPlace {
  chunk?: number;
  layer: number;
  part: "K" | "V";
  tokens: number;
  headDim: number;
  start: number;
}

/**
 * Refuses a decoded K or V block holding a value that is not finite in its stored dtype, beyond
 * {@link KV_MAX_ABS}, or that overflows the cache dtype it is written into.
 * @param bytes the block (its own dtype, little-endian; aligned copies from the chunk decoder),
 *   shaped (kv_heads, tokens, head_dim)
 * @param dtype the block's dtype
 * @param into the importing cache's dtype
 * @param place names the block and gives its shape, for the message
 * @throws {SnapshotError} kind "format" naming the first offending element's layer, K/V, head,
 *   token position and dim
 */
export function checkKvValues(
  bytes: Uint8Array,
  dtype: CacheDtype,
  into: CacheDtype,
  place: KvBlockPlace,
): void {
  const fail = (i: number, x: number) => {
    const { chunk, layer, part, tokens, headDim, start } = place;
    const head = Math.floor(i / (tokens * headDim));
    const token = Math.floor(i / headDim) % tokens;
    const where = `${
      chunk === undefined ? "" : `chunk ${chunk} `
    }layer ${layer} ${part}, head ${head}, token position ${start + token}, dim ${
      i % headDim
    }: value ${x}`;
    const why = !Number.isFinite(x)
      ? " is not finite; KV values must be finite"
      : Math.abs(x) > KV_MAX_ABS
      ? ` exceeds the KV magnitude bound ${KV_MAX_ABS} (2^24)`
      : ` overflows the ${into} cache`;
    throw new SnapshotError("format", where + why);
  };
  if (dtype === "f32") {
    const f = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 2);
    const u = new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 2);
    for (let i = 0; i < f.length; i++) {
      const x = f[i];
      // !(|x| <= bound) also catches NaN
      if (!(Math.abs(x) <= KV_MAX_ABS)) fail(i, x);
      if (into !== "f32" && overflows(x, into, u[i])) fail(i, x);
    }
    return;
  }
  const h = new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 1);
  const u = new Uint32Array(1);
  const f = new Float32Array(u.buffer);
  if (dtype === "f16") {
    // Every finite f16 (|x| ≤ 65504) is within the bound and fits f32 and bf16.
    for (let i = 0; i < h.length; i++) {
      if ((h[i] & 0x7c00) === 0x7c00) {
        fail(i, (h[i] & 0x3ff) ? NaN : h[i] & 0x8000 ? -Infinity : Infinity);
      }
    }
    return;
  }
  // bf16: the upper half of an f32
  for (let i = 0; i < h.length; i++) {
    u[0] = h[i] << 16;
    const x = f[0];
    if (!(Math.abs(x) <= KV_MAX_ABS)) fail(i, x);
    if (into === "f16" && Math.abs(x) >= F16_OVERFLOW) fail(i, x);
  }
}
