// Small byte helpers used across lib/ and functions/: lowercase hex both ways and SHA-256. One
// home, so every fingerprint, cache key and auth digest spells them the same way.

import { createHash } from "node:crypto";

/**
 * Lowercase hex of bytes.
 * @param bytes the bytes (a Uint8Array or an ArrayBuffer)
 * @returns two hex digits per byte
 */
export function hex(bytes: Uint8Array | ArrayBuffer): string {
  const b = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  let s = "";
  for (const x of b) s += x.toString(16).padStart(2, "0");
  return s;
}

/**
 * Bytes of an even-length hex string.
 * @param text hex digits (either case)
 * @returns the bytes
 * @throws {TypeError} when `text` is not an even number of hex digits
 */
export function fromHex(text: string): Uint8Array {
  if (typeof text !== "string" || text.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(text)) {
    throw new TypeError(`expected an even number of hex digits, got ${JSON.stringify(text)}`);
  }
  const out = new Uint8Array(text.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(text.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/**
 * The concatenation of `parts`, in order, in one new array.
 * @param parts byte arrays (any number)
 * @returns a fresh Uint8Array of the summed length
 */
export function concatBytes(parts: readonly Uint8Array[]): Uint8Array<ArrayBuffer> {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

/** Inputs up to this many bytes are hashed on the calling thread (see sha256). */
const SYNC_HASH_BYTES = 64 * 1024;

/**
 * SHA-256 of the concatenation of `parts`.
 * @param parts one or more byte arrays
 * @returns the 32-byte digest
 */
export function sha256(...parts: Uint8Array[]): Promise<Uint8Array> {
  let n = 0;
  for (const p of parts) n += p.length;
  if (n > SYNC_HASH_BYTES) {
    // Large inputs (model weights, snapshots) through Web Crypto's digest, which runs off this
    // thread: hashing megabytes synchronously would hold the event loop (I/O, timers) meanwhile.
    const data = parts.length === 1 ? parts[0] : concatBytes(parts);
    return crypto.subtle.digest("SHA-256", data as Uint8Array<ArrayBuffer>).then((d) =>
      new Uint8Array(d)
    );
  }
  // node:crypto hashes on this thread: a short input (a prefix-cache block key, one per 16 prompt
  // tokens) costs ~4 µs where Web Crypto's digest, an async op, cost ~30 µs on our machines.
  const h = createHash("sha256");
  for (const p of parts) h.update(p);
  return Promise.resolve(Uint8Array.from(h.digest())); // a copy: the Buffer may view a shared pool
}
