// HMAC-SHA256 authentication of snapshots through Web Crypto: one tag over the prefix+header and
// one per chunk frame, chained through the header tag so chunks cannot be moved between
// snapshots. Not key management: callers hold keys by key id.

import { concatBytes } from "../util/mod.ts";
import { SnapshotError } from "./errors.ts";

/** Raw key bytes (>= 16 bytes) or an HMAC-SHA256 CryptoKey usable for sign/verify. */
export type HmacKey = Uint8Array | CryptoKey;
/** Keys by key id, for verification. */
export type KeyRing = Map<string, HmacKey> | Record<string, HmacKey>;

const enc = new TextEncoder();
/** Domain separation prefixes (NUL-terminated ASCII). */
export const HEADER_DOMAIN: Uint8Array = enc.encode("kvrelay-snapshot-header\0");
export const CHUNK_DOMAIN: Uint8Array = enc.encode("kvrelay-snapshot-chunk\0");

const cache = new WeakMap<Uint8Array, CryptoKey>();

/**
 * Turns raw bytes into a Web Crypto HMAC-SHA256 key (memoized per array).
 * @param key raw bytes (at least 16) or a CryptoKey, returned as is
 * @returns the CryptoKey
 * @throws TypeError when raw key is shorter than 16 bytes
 */
export async function toCryptoKey(key: HmacKey): Promise<CryptoKey> {
  if (!(key instanceof Uint8Array)) return key;
  if (key.length < 16) throw new TypeError(`HMAC key must be >= 16 bytes, got ${key.length}`);
  let k = cache.get(key);
  if (!k) {
    k = await crypto.subtle.importKey(
      "raw",
      key.slice(),
      { name: "HMAC", hash: "SHA-256" },
      false,
      ["sign", "verify"],
    );
    cache.set(key, k);
  }
  return k;
}

/**
 * Header tag: HMAC(key, HEADER_DOMAIN ‖ prefix+header bytes).
 * @returns 32-byte tag
 */
export async function signHeader(key: CryptoKey, prefixAndHeader: Uint8Array): Promise<Uint8Array> {
  const buf = concatBytes([HEADER_DOMAIN, prefixAndHeader]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", key, buf));
}

/**
 * Chunk tag: HMAC(key, CHUNK_DOMAIN ‖ header tag ‖ frame bytes before the tag).
 * @returns 32-byte tag
 */
export async function signChunk(
  key: CryptoKey,
  headerTag: Uint8Array,
  frameWithoutTag: Uint8Array,
): Promise<Uint8Array> {
  const buf = concatBytes([CHUNK_DOMAIN, headerTag, frameWithoutTag]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", key, buf));
}

/**
 * Verifies a tag in constant time (Web Crypto verify).
 * @throws SnapshotError signature when it does not match
 */
export async function verifyTag(
  key: CryptoKey,
  parts: Uint8Array[],
  tag: Uint8Array,
  what: string,
): Promise<void> {
  const ok = await crypto.subtle.verify("HMAC", key, tag.slice(), concatBytes(parts));
  if (!ok) throw new SnapshotError("signature", `${what} HMAC-SHA256 tag does not verify`);
}

/**
 * Finds a key by id in a key ring.
 * @returns the key, or undefined when the id is unknown
 */
export function lookupKey(keys: KeyRing, keyId: string): HmacKey | undefined {
  if (keys instanceof Map) return keys.get(keyId);
  return Object.hasOwn(keys, keyId) ? keys[keyId] : undefined;
}
