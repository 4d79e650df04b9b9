// RedisStore: a SnapshotStore over a redis server through node-redis (@redis/client), binary-safe,
// TTL via SET ... PX, keys namespaced by a prefix, failing fast with StoreError "unavailable"
// while the server is down or hung and recovering by itself when it returns. The byte budget is
// the server's own (maxmemory + allkeys-lru); this client does not track sizes.

import { Buffer } from "node:buffer";
import { createClient, ErrorReply, RESP_TYPES } from "@redis/client";
import {
  type PutOptions,
  type SnapshotStore,
  StoreError,
  validateBudget,
  validateKey,
  validateTtl,
  validateValue,
} from "./store.ts";

/** Redis's default `proto-max-bulk-len`: the largest string value a server accepts (512 MiB). */
export const REDIS_MAX_VALUE_BYTES = 512 * 1024 * 1024;

/** Options of {@link RedisStore}. */
export interface RedisStoreOptions {
  /** `redis://[[user]:password@]host[:port][/db]`. Default `redis://127.0.0.1:6379`. */
  url?: string;
  /** Prepended to every key (namespace), `[A-Za-z0-9._:-]{0,64}`. Default `"kvrelay:"`. */
  keyPrefix?: string;
  /** TTL in ms applied when `put` gives none. Default: none. */
  defaultTtlMs?: number;
  /**
   * Largest single value accepted, in bytes; larger → StoreError `too_large` before any network
   * I/O. Default and upper limit {@link REDIS_MAX_VALUE_BYTES}. This is NOT the store's total
   * budget: that is the server's `maxmemory` (see {@link RedisStore}).
   */
  maxBytes?: number;
  /**
   * When set, `connect()` runs `CONFIG SET maxmemory <applyServerBudget> maxmemory-policy
   * allkeys-lru` on the server (needs CONFIG allowed; affects every user of that server).
   */
  applyServerBudget?: number;
  /** TCP connect timeout in ms, also how long `connect()` waits for the first connection. Default 1000. */
  connectTimeoutMs?: number;
  /** A command without a reply after this many ms fails with `unavailable`. Default 2000. */
  commandTimeoutMs?: number;
  /** Longest wait between background reconnect attempts in ms (backoff 50 ms·n up to this). Default 1000. */
  maxReconnectDelayMs?: number;
}

/**
 * A redis-backed store.
 *
 * Availability: the client never queues commands while disconnected (`disableOfflineQueue`), so
 * every call made while the server is down rejects at once with StoreError `unavailable`; a
 * server that accepts the connection but does not answer (hung, overloaded) fails each call
 * after `commandTimeoutMs`. The client reconnects in the background (backoff up to
 * `maxReconnectDelayMs`), and calls succeed again as soon as it is back.
 *
 * Byte budget, honestly: redis evicts, not this client. Run the server with
 * `--maxmemory <bytes> --maxmemory-policy allkeys-lru` (or pass `applyServerBudget`). That
 * budget covers the server's whole memory (all keys of all namespaces plus ~50-100 bytes of
 * overhead per key) and its LRU is approximate (sampled), so "least recently used" is
 * statistical, not exact. Under `noeviction` a full server answers OOM, surfaced as StoreError
 * `too_large`. `maxBytes` only caps single values.
 */
export class RedisStore implements SnapshotStore {
  /** Always `"redis"`. */
  readonly kind = "redis" as const;
  /** The key namespace. */
  readonly keyPrefix: string;
  /** Server address without credentials, for messages. */
  readonly address: string;
  readonly #client;
  readonly #defaultTtlMs: number | undefined;
  readonly #maxBytes: number;
  readonly #commandTimeoutMs: number;
  readonly #connecting: Promise<unknown>;
  #lastError = "not connected yet";
  #closed = false;

  /**
   * Creates the client and starts connecting in the background; calls fail fast with
   * `unavailable` until the first connection is up. Prefer {@link RedisStore.connect}.
   * @param opts address, namespace, TTL, limits and timeouts
   * @throws {TypeError} when `url` is not a redis URL
   * @throws {RangeError} on out-of-range options or a bad `keyPrefix`
   */
  constructor(opts: RedisStoreOptions = {}) {
    const url = opts.url ?? "redis://127.0.0.1:6379";
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new TypeError(`RedisStore url ${JSON.stringify(url)} is not a URL`);
    }
    if (parsed.protocol !== "redis:" && parsed.protocol !== "rediss:") {
      throw new TypeError(`RedisStore url must start with redis:// or rediss://, got "${url}"`);
    }
    this.address = `${parsed.hostname}:${parsed.port || "6379"}`;
    const prefix = opts.keyPrefix ?? "kvrelay:";
    if (typeof prefix !== "string" || !/^[A-Za-z0-9._:-]{0,64}$/.test(prefix)) {
      throw new RangeError(
        `keyPrefix ${JSON.stringify(prefix)} must be 0..64 characters of [A-Za-z0-9._:-]`,
      );
    }
    this.keyPrefix = prefix;
    this.#defaultTtlMs = validateTtl(opts.defaultTtlMs, "defaultTtlMs");
    this.#maxBytes = validateBudget(opts.maxBytes) ?? REDIS_MAX_VALUE_BYTES;
    if (this.#maxBytes > REDIS_MAX_VALUE_BYTES) {
      throw new RangeError(
        `maxBytes ${this.#maxBytes} exceeds redis's value limit of ${REDIS_MAX_VALUE_BYTES} bytes`,
      );
    }
    validateBudget(opts.applyServerBudget, "applyServerBudget");
    const connectTimeoutMs = positiveInt(opts.connectTimeoutMs ?? 1000, "connectTimeoutMs");
    this.#commandTimeoutMs = positiveInt(opts.commandTimeoutMs ?? 2000, "commandTimeoutMs");
    const maxDelay = positiveInt(opts.maxReconnectDelayMs ?? 1000, "maxReconnectDelayMs");

    this.#client = createClient({
      url,
      disableOfflineQueue: true, // fail fast while disconnected instead of queueing forever
      socket: {
        connectTimeout: connectTimeoutMs,
        reconnectStrategy: (retries: number) => Math.min(50 * (retries + 1), maxDelay),
      },
    }).withTypeMapping({ [RESP_TYPES.BLOB_STRING]: Buffer });
    this.#client.on("error", (e: unknown) => {
      this.#lastError = e instanceof Error ? e.message : String(e);
    });
    const budget = opts.applyServerBudget;
    this.#connecting = this.#client.connect().then(async () => {
      if (budget !== undefined) {
        await this.#client.configSet({
          "maxmemory": String(budget),
          "maxmemory-policy": "allkeys-lru",
        });
      }
    });
    this.#connecting.catch(() => {}); // rejects when closed before connecting; seen via connect()
  }

  /**
   * Connects and waits (up to `connectTimeoutMs`) for the server.
   * @param opts see {@link RedisStoreOptions}
   * @returns a connected store
   * @throws {StoreError} `unavailable` (client closed again) when the server cannot be reached in time
   * @throws {TypeError|RangeError} on bad options
   */
  static async connect(opts: RedisStoreOptions = {}): Promise<RedisStore> {
    const store = new RedisStore(opts);
    const wait = opts.connectTimeoutMs ?? 1000;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<"timeout">((r) => (timer = setTimeout(() => r("timeout"), wait)));
    try {
      const r = await Promise.race([store.#connecting.then(() => "ok" as const), timeout]);
      if (r === "timeout") {
        throw new StoreError(
          "unavailable",
          "redis",
          `redis at ${store.address} is unavailable: no connection within ${wait} ms (${store.#lastError})`,
        );
      }
      return store;
    } catch (e) {
      await store.close();
      throw e instanceof StoreError ? e : store.#map(e, "connect");
    } finally {
      clearTimeout(timer);
    }
  }

  /** {@inheritDoc SnapshotStore.put} */
  async put(key: string, value: Uint8Array, opts: PutOptions = {}): Promise<void> {
    this.#open();
    validateKey(key);
    validateValue(value);
    const ttl = validateTtl(opts.ttlMs) ?? this.#defaultTtlMs;
    if (value.byteLength > this.#maxBytes) {
      throw new StoreError(
        "too_large",
        "redis",
        `value for key "${key}" is ${value.byteLength} bytes, larger than maxBytes ${this.#maxBytes}`,
      );
    }
    const buf = Buffer.from(value.buffer, value.byteOffset, value.byteLength); // no copy
    await this.#run(
      `SET "${key}"`,
      () =>
        this.#client.set(
          this.keyPrefix + key,
          buf,
          ttl === undefined ? undefined : {
            expiration: { type: "PX", value: ttl },
          },
        ),
    );
  }

  /** {@inheritDoc SnapshotStore.get} */
  async get(key: string): Promise<Uint8Array | null> {
    this.#open();
    validateKey(key);
    const got = await this.#run(`GET "${key}"`, () => this.#client.get(this.keyPrefix + key));
    if (got === null || got === undefined) return null;
    // copy out of the client's (possibly pooled) Buffer into bytes the caller owns
    return new Uint8Array(got as unknown as Uint8Array);
  }

  /** {@inheritDoc SnapshotStore.has} */
  async has(key: string): Promise<boolean> {
    this.#open();
    validateKey(key);
    return (await this.#run(`EXISTS "${key}"`, () => this.#client.exists(this.keyPrefix + key))) >
      0;
  }

  /** {@inheritDoc SnapshotStore.delete} */
  async delete(key: string): Promise<boolean> {
    this.#open();
    validateKey(key);
    return (await this.#run(`DEL "${key}"`, () => this.#client.del(this.keyPrefix + key))) > 0;
  }

  /** {@inheritDoc SnapshotStore.close} */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    // destroy, not quit: no waiting on a dead or hung server; stops reconnect timers too
    this.#client.destroy();
    await this.#connecting.catch(() => {});
  }

  #open(): void {
    if (this.#closed) {
      throw new StoreError("unavailable", "redis", `RedisStore for ${this.address} is closed`);
    }
  }

  /** Runs one command with a reply deadline, mapping failures to StoreError. */
  async #run<T>(what: string, fn: () => Promise<T>): Promise<T> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () =>
          reject(
            new StoreError(
              "unavailable",
              "redis",
              `redis at ${this.address} is unavailable: ${what} got no reply within ${this.#commandTimeoutMs} ms`,
            ),
          ),
        this.#commandTimeoutMs,
      );
    });
    // node-redis only times out commands not yet written; a written one waits for its reply
    // (FIFO matching stays correct), so the deadline here abandons it without desyncing.
    const p = fn();
    p.catch(() => {}); // an abandoned command may reject later
    try {
      return await Promise.race([p, deadline]);
    } catch (e) {
      throw this.#map(e, what);
    } finally {
      clearTimeout(timer);
    }
  }

  #map(e: unknown, what: string): StoreError {
    if (e instanceof StoreError) return e;
    const msg = e instanceof Error ? e.message : String(e);
    if (e instanceof ErrorReply) {
      if (msg.startsWith("OOM")) {
        return new StoreError(
          "too_large",
          "redis",
          `redis at ${this.address} is full (maxmemory reached, policy refuses to evict): ${what}: ${msg}`,
          { cause: e },
        );
      }
      return new StoreError("io", "redis", `redis at ${this.address}: ${what} failed: ${msg}`, {
        cause: e,
      });
    }
    // offline, closed socket, connect timeout, reset: the server is not reachable now
    return new StoreError(
      "unavailable",
      "redis",
      `redis at ${this.address} is unavailable: ${what}: ${msg}${
        this.#lastError && this.#lastError !== msg
          ? ` (last connection error: ${this.#lastError})`
          : ""
      }`,
      { cause: e },
    );
  }
}

function positiveInt(v: unknown, what: string): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < 1 || v > 2 ** 31 - 1) {
    throw new RangeError(`${what} must be an integer in 1..2^31-1 ms, got ${String(v)}`);
  }
  return v;
}
