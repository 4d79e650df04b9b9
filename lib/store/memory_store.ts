// MemoryStore: an in-process SnapshotStore, LRU by bytes with optional TTL.
// It is not shared between processes and does not survive restarts (see FsStore, RedisStore).
// Budget counts value bytes only (keys and bookkeeping, ~100 B/entry, are not counted).

import {
  type PutOptions,
  type SnapshotStore,
  StoreError,
  validateBudget,
  validateKey,
  validateTtl,
  validateValue,
} from "./store.ts";

/** Constructor options of {@link MemoryStore}. */
export interface MemoryStoreOptions {
  /** Byte budget over all values; least-recently-used entries are evicted past it. Default: none. */
  maxBytes?: number;
  /** TTL in ms applied when `put` gives none. Default: none (entries live until evicted). */
  defaultTtlMs?: number;
  /** Clock in ms (monotonic or wall, only differences matter). Default: `Date.now`. */
  now?: () => number;
  /** Period of the background expiry sweep in ms; 0 disables it. Default: 60000. */
  sweepIntervalMs?: number;
}

/** Counters of a {@link MemoryStore}, all since construction. */
export interface MemoryStoreStats {
  /** Live entries now (expired ones not yet swept included until touched). */
  entries: number;
  /** Sum of the stored values' byteLength now. */
  bytes: number;
  /** `get` calls that returned a value. */
  hits: number;
  /** `get` calls that returned null. */
  misses: number;
  /** Successful `put` calls. */
  puts: number;
  /** Entries removed to stay within `maxBytes`. */
  evictions: number;
  /** Entries removed because their TTL passed (lazily or by a sweep). */
  expirations: number;
}

interface Entry {
  value: Uint8Array;
  /** Absolute expiry on the store's clock in ms, or undefined for none. */
  expiresAt: number | undefined;
}

/**
 * In-memory LRU store. Recency order is the Map's insertion order: `put` and a `get` hit make a
 * key most recent (`has` does not). `put` copies the value and `get` returns a fresh copy, so
 * callers may reuse their buffers.
 */
export class MemoryStore implements SnapshotStore {
  /** Always `"memory"`. */
  readonly kind = "memory" as const;
  readonly #maxBytes: number | undefined;
  readonly #defaultTtlMs: number | undefined;
  readonly #now: () => number;
  readonly #entries = new Map<string, Entry>();
  #bytes = 0;
  #closed = false;
  #timer: ReturnType<typeof setInterval> | undefined;
  #stats = { hits: 0, misses: 0, puts: 0, evictions: 0, expirations: 0 };

  /**
   * @param opts budget, default TTL, clock and sweep period
   * @throws {RangeError} when `maxBytes`, `defaultTtlMs` or `sweepIntervalMs` is out of range
   * @throws {TypeError} when `now` is given and is not a function
   */
  constructor(opts: MemoryStoreOptions = {}) {
    this.#maxBytes = validateBudget(opts.maxBytes);
    this.#defaultTtlMs = validateTtl(opts.defaultTtlMs, "defaultTtlMs");
    if (opts.now !== undefined && typeof opts.now !== "function") {
      throw new TypeError(`now must be a function returning ms, got ${typeof opts.now}`);
    }
    this.#now = opts.now ?? Date.now;
    const sweep = opts.sweepIntervalMs ?? 60_000;
    if (!Number.isInteger(sweep) || sweep < 0 || sweep > 2 ** 31 - 1) {
      throw new RangeError(`sweepIntervalMs must be an integer in 0..2^31-1, got ${sweep}`);
    }
    if (sweep > 0) {
      const timer = setInterval(() => this.sweep(), sweep);
      Deno.unrefTimer(timer); // never keeps the process alive
      this.#timer = timer;
    }
  }

  /**
   * Removes every expired entry now (also runs every `sweepIntervalMs`).
   * @returns how many entries were removed
   */
  sweep(): number {
    const now = this.#now();
    let removed = 0;
    for (const [key, e] of this.#entries) {
      if (e.expiresAt !== undefined && e.expiresAt <= now) {
        this.#remove(key, e);
        this.#stats.expirations++;
        removed++;
      }
    }
    return removed;
  }

  /**
   * @returns a snapshot of the counters
   */
  stats(): MemoryStoreStats {
    return { entries: this.#entries.size, bytes: this.#bytes, ...this.#stats };
  }

  /** {@inheritDoc SnapshotStore.put} */
  put(key: string, value: Uint8Array, opts: PutOptions = {}): Promise<void> {
    try {
      this.#open();
      validateKey(key);
      validateValue(value);
      const ttl = validateTtl(opts.ttlMs) ?? this.#defaultTtlMs;
      const size = value.byteLength;
      if (this.#maxBytes !== undefined && size > this.#maxBytes) {
        throw new StoreError(
          "too_large",
          "memory",
          `value for key "${key}" is ${size} bytes, larger than the store's whole budget of ${this.#maxBytes} bytes`,
        );
      }
      const old = this.#entries.get(key);
      if (old) this.#remove(key, old);
      if (this.#maxBytes !== undefined && this.#bytes + size > this.#maxBytes) {
        this.sweep(); // expired entries go before live ones
        for (const [k, e] of this.#entries) { // oldest first
          if (this.#bytes + size <= this.#maxBytes) break;
          this.#remove(k, e);
          this.#stats.evictions++;
        }
      }
      this.#entries.set(key, {
        value: value.slice(),
        expiresAt: ttl === undefined ? undefined : this.#now() + ttl,
      });
      this.#bytes += size;
      this.#stats.puts++;
      return Promise.resolve();
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** {@inheritDoc SnapshotStore.get} */
  get(key: string): Promise<Uint8Array | null> {
    try {
      this.#open();
      validateKey(key);
      const e = this.#live(key);
      if (!e) {
        this.#stats.misses++;
        return Promise.resolve(null);
      }
      this.#entries.delete(key); // move to the most-recent end
      this.#entries.set(key, e);
      this.#stats.hits++;
      return Promise.resolve(e.value.slice());
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** {@inheritDoc SnapshotStore.has} */
  has(key: string): Promise<boolean> {
    try {
      this.#open();
      validateKey(key);
      return Promise.resolve(this.#live(key) !== undefined);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** {@inheritDoc SnapshotStore.delete} */
  delete(key: string): Promise<boolean> {
    try {
      this.#open();
      validateKey(key);
      const e = this.#live(key);
      if (e) this.#remove(key, e);
      return Promise.resolve(e !== undefined);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** {@inheritDoc SnapshotStore.close} */
  close(): Promise<void> {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    this.#closed = true;
    this.#entries.clear();
    this.#bytes = 0;
    return Promise.resolve();
  }

  /** The entry if present and unexpired; an expired one is removed (lazy expiry). */
  #live(key: string): Entry | undefined {
    const e = this.#entries.get(key);
    if (!e) return undefined;
    if (e.expiresAt !== undefined && e.expiresAt <= this.#now()) {
      this.#remove(key, e);
      this.#stats.expirations++;
      return undefined;
    }
    return e;
  }

  #remove(key: string, e: Entry): void {
    this.#entries.delete(key);
    this.#bytes -= e.value.byteLength;
  }

  #open(): void {
    if (this.#closed) throw new StoreError("unavailable", "memory", "MemoryStore is closed");
  }
}
