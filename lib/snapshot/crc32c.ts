// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), slice-by-8 in plain TypeScript.
// Used for the snapshot header and per-chunk checksums; not a cryptographic digest (HMAC is).

const POLY = 0x82f63b78;

// 8 tables of 256 u32: T[k][b] = CRC of byte b followed by k zero bytes.
const TABLES: Uint32Array = (() => {
  const t = new Uint32Array(8 * 256);
  for (let b = 0; b < 256; b++) {
    let c = b;
    for (let i = 0; i < 8; i++) c = c & 1 ? (c >>> 1) ^ POLY : c >>> 1;
    t[b] = c >>> 0;
  }
  for (let b = 0; b < 256; b++) {
    for (let k = 1; k < 8; k++) {
      const prev = t[(k - 1) * 256 + b];
      t[k * 256 + b] = (prev >>> 8) ^ t[prev & 0xff];
    }
  }
  return t;
})();

/**
 * Extends a running CRC32C with more bytes. Start with `crc32c(first)` and feed the result back.
 * @param bytes data to add
 * @param crc CRC32C of everything before `bytes` (0 for none)
 * @returns CRC32C of the concatenation, as an unsigned 32-bit number
 */
export function crc32cUpdate(bytes: Uint8Array, crc = 0): number {
  let c = ~crc >>> 0;
  const n = bytes.length;
  let i = 0;
  const t = TABLES;
  // Bulk: 8 bytes per step.
  const end8 = n - (n % 8);
  while (i < end8) {
    const lo = (bytes[i] | (bytes[i + 1] << 8) | (bytes[i + 2] << 16) | (bytes[i + 3] << 24)) ^ c;
    const hi = bytes[i + 4] | (bytes[i + 5] << 8) | (bytes[i + 6] << 16) | (bytes[i + 7] << 24);
    c = t[7 * 256 + (lo & 0xff)] ^ t[6 * 256 + ((lo >>> 8) & 0xff)] ^
      t[5 * 256 + ((lo >>> 16) & 0xff)] ^ t[4 * 256 + (lo >>> 24)] ^
      t[3 * 256 + (hi & 0xff)] ^ t[2 * 256 + ((hi >>> 8) & 0xff)] ^
      t[256 + ((hi >>> 16) & 0xff)] ^ t[hi >>> 24];
    i += 8;
  }
  while (i < n) c = t[(c ^ bytes[i++]) & 0xff] ^ (c >>> 8);
  return ~c >>> 0;
}

/**
 * CRC32C of `bytes`.
 * @param bytes data
 * @returns the checksum as an unsigned 32-bit number (e.g. "123456789" → 0xE3069283)
 */
export function crc32c(bytes: Uint8Array): number {
  return crc32cUpdate(bytes, 0);
}
