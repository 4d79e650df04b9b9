// The snapshot store contract: one `SnapshotStore` interface that MemoryStore, FsStore and
// RedisStore implement, plus key validation, content addressing and the one error type.
// It holds no bytes itself and knows nothing of the snapshot format (that is lib/snapshot) or of
// prefix-cache keys (lib/store/prefix_cache.ts builds keys and calls these stores).

import { hex, sha256 } from "../util/mod.ts";

/** Which backend a store is. */
export type StoreKind = "memory" | "fs" | "redis";

/**
 * Why a store operation failed:
 * - `unavailable`: the backend cannot be reached now (redis down, connect timeout); retry later.
 * - `too_large`: the value alone exceeds the store's whole byte budget (or a backend hard limit).
 * - `io`: the backend was reached but the operation failed (disk error, corrupt entry, protocol).
 */
export type StoreErrorKind = "unavailable" | "too_large" | "io";

/** The error every store throws for backend failures (bad arguments throw TypeError/RangeError). */
export class StoreError extends Error {
  /** What went wrong, see {@link StoreErrorKind}. */
  readonly kind: StoreErrorKind;
  /** The store that failed. */
  readonly store: StoreKind;

  /**
   * @param kind what went wrong
   * @param store the store that failed
   * @param message human-readable text quoting the offending values
   * @param options `cause`: the underlying error, if any
   */
  constructor(
    kind: StoreErrorKind,
    store: StoreKind,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "StoreError";
    this.kind = kind;
    this.store = store;
  }
}

/** Options for one `put`. */
export interface PutOptions {
  /** Time to live in milliseconds (integer ≥ 1); absent → the store's default (none: forever). */
  ttlMs?: number;
}

/**
 * A key → bytes store for encoded KV snapshots and prefix-cache chunks.
 *
 * Contract shared by all implementations:
 * - Keys pass {@link validateKey} (else RangeError/TypeError before any I/O).
 * - A `put` is atomic: a concurrent or later `get` sees either the old whole value, the new whole
 *   value, or nothing — never a torn entry. Metadata (TTL) and payload are one object.
 * - `get` returns bytes the caller owns (mutating them does not change the stored value), or
 *   `null` when the key is absent or expired. The store never holds a reference to the caller's
 *   `value` after `put` resolves.
 * - Expired entries are invisible to `get`/`has` and do not count as deleted by `delete`.
 * - After `close()` every method rejects with `StoreError` kind `unavailable`; `close` twice is fine.
 */
export interface SnapshotStore {
  /** Which backend this is. */
  readonly kind: StoreKind;
  /**
   * Stores `value` under `key`, replacing any previous value.
   * @param key see {@link validateKey}
   * @param value the bytes (copied or written out before the promise resolves)
   * @param opts `ttlMs`: expire after this many milliseconds
   * @throws {RangeError} bad key or ttlMs; {@link StoreError} `too_large` / `unavailable` / `io`
   */
  put(key: string, value: Uint8Array, opts?: PutOptions): Promise<void>;
  /**
   * @param key see {@link validateKey}
   * @returns the stored bytes, or null when absent or expired
   * @throws {RangeError} bad key; {@link StoreError} `unavailable` / `io`
   */
  get(key: string): Promise<Uint8Array | null>;
  /**
   * @param key see {@link validateKey}
   * @returns whether a live (unexpired) entry exists
   * @throws {RangeError} bad key; {@link StoreError} `unavailable` / `io`
   */
  has(key: string): Promise<boolean>;
  /**
   * @param key see {@link validateKey}
   * @returns true when a live entry was removed, false when there was none
   * @throws {RangeError} bad key; {@link StoreError} `unavailable` / `io`
   */
  delete(key: string): Promise<boolean>;
  /** Releases connections/timers; later calls reject with StoreError `unavailable`. */
  close(): Promise<void>;
}

/** Longest key accepted, in characters (keys become file names: 255-byte limit with suffixes). */
export const MAX_KEY_LENGTH = 200;

const KEY_RE = /^[A-Za-z0-9_:-][A-Za-z0-9._:-]*$/;

/**
 * Checks a store key: 1..{@link MAX_KEY_LENGTH} characters from `[A-Za-z0-9._:-]`, not starting
 * with `.` (so keys can never be `.`/`..` or collide with FsStore's hidden temp files).
 * @param key the candidate key
 * @returns nothing; returns normally when the key is valid
 * @throws {TypeError} when `key` is not a string
 * @throws {RangeError} when it is empty, too long, starts with `.` or has other characters
 */
export function validateKey(key: unknown): asserts key is string {
  if (typeof key !== "string") {
    throw new TypeError(`store key must be a string, got ${typeof key}`);
  }
  if (key.length === 0) throw new RangeError(`store key must not be empty`);
  if (key.length > MAX_KEY_LENGTH) {
    throw new RangeError(
      `store key is ${key.length} characters, the limit is ${MAX_KEY_LENGTH}: "${
        key.slice(0, 40)
      }..."`,
    );
  }
  if (!KEY_RE.test(key)) {
    throw new RangeError(
      `store key ${JSON.stringify(key)} must use only [A-Za-z0-9._:-] and must not start with "."`,
    );
  }
}

/**
 * Checks a value passed to `put`.
 * @param value the candidate value
 * @throws {TypeError} when it is not a Uint8Array
 */
export function validateValue(value: unknown): asserts value is Uint8Array {
  if (!(value instanceof Uint8Array)) {
    const got = value === null
      ? "null"
      : typeof value === "object"
      ? (value as object).constructor?.name ?? "object"
      : typeof value;
    throw new TypeError(`store value must be a Uint8Array, got ${got}`);
  }
}

/** Largest accepted TTL: 2^31-1 ms (about 24.8 days; the limit of setTimeout-style timers). */
export const MAX_TTL_MS = 2 ** 31 - 1;

/**
 * Checks a TTL in milliseconds.
 * @param ttlMs candidate TTL (undefined means "no TTL")
 * @param what the option name quoted in errors
 * @returns the TTL, or undefined
 * @throws {RangeError} when it is not an integer in 1..{@link MAX_TTL_MS}
 */
export function validateTtl(ttlMs: unknown, what = "ttlMs"): number | undefined {
  if (ttlMs === undefined) return undefined;
  if (
    typeof ttlMs !== "number" || !Number.isInteger(ttlMs) || ttlMs < 1 || ttlMs > MAX_TTL_MS
  ) {
    throw new RangeError(`${what} must be an integer in 1..${MAX_TTL_MS} ms, got ${String(ttlMs)}`);
  }
  return ttlMs;
}

/**
 * Checks a byte budget.
 * @param maxBytes candidate budget in bytes (undefined means "unbounded")
 * @param what the option name quoted in errors
 * @returns the budget, or undefined
 * @throws {RangeError} when it is not a safe integer ≥ 1
 */
export function validateBudget(maxBytes: unknown, what = "maxBytes"): number | undefined {
  if (maxBytes === undefined) return undefined;
  if (typeof maxBytes !== "number" || !Number.isSafeInteger(maxBytes) || maxBytes < 1) {
    throw new RangeError(`${what} must be a safe integer ≥ 1 byte, got ${String(maxBytes)}`);
  }
  return maxBytes;
}

/**
 * Content address of a value: lowercase hex SHA-256 (64 characters, a valid store key).
 * @param value the bytes to hash
 * @returns 64 hex characters
 * @throws {TypeError} when `value` is not a Uint8Array
 */
export async function contentKey(value: Uint8Array): Promise<string> {
  validateValue(value);
  return hex(await sha256(value));
}
