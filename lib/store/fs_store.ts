// FsStore: a SnapshotStore of one file per entry under a directory, written atomically
// (temp file + fsync + rename), surviving restarts, with TTL in a header inside the same file and
// an LRU byte budget. It is not a database: no cross-process locking (see notes on FsStore).

import { hex } from "../util/mod.ts";
import {
  type PutOptions,
  type SnapshotStore,
  StoreError,
  validateBudget,
  validateKey,
  validateTtl,
  validateValue,
} from "./store.ts";

/**
 * Entry file layout (little-endian), one file `<dir>/<fan>/<key>`, where `<fan>` is 2 lowercase
 * hex digits of FNV-1a-32(key) & 0xff (256 subdirectories):
 *
 * | offset | size | field                                                      |
 * |--------|------|------------------------------------------------------------|
 * | 0      | 4    | magic `"KVRS"`                                             |
 * | 4      | 1    | version, 1                                                 |
 * | 5      | 1    | flags, 0 (readers reject other values)                     |
 * | 6      | 2    | header length in bytes, 24                                 |
 * | 8      | 8    | expiresAt: f64 ms since the Unix epoch, 0 = never expires  |
 * | 16     | 8    | payload length in bytes (u64), = file size - header length |
 * | 24     | n    | payload (the value)                                        |
 */
export const FS_ENTRY_HEADER_BYTES = 24;
const MAGIC = [0x4b, 0x56, 0x52, 0x53]; // "KVRS"
const VERSION = 1;
/** Temp files are `<fan>/.tmp-<pid>-<16 hex>`; keys cannot start with "." so they never collide. */
const TEMP_PREFIX = ".tmp-";

/** Constructor options of {@link FsStore}. */
export interface FsStoreOptions {
  /**
   * Byte budget over entry files (header + payload bytes); least-recently-used entries are
   * removed past it. Default: none.
   */
  maxBytes?: number;
  /** TTL in ms applied when `put` gives none. Default: none. */
  defaultTtlMs?: number;
  /**
   * Clock in ms since the Unix epoch, used for TTL and for recency (entry mtimes). Default:
   * `Date.now`. Must be wall-clock-like: expiry times are stored absolute in the files.
   */
  now?: () => number;
  /**
   * At open, temp files whose mtime is older than this many ms (on the real wall clock) are
   * deleted; 0 deletes all temp files. Default: 600000 (10 min). A live writer keeps its temp
   * file's mtime fresh while writing, so another process's in-flight write is not removed
   * unless it stalled for this long; use 0 only when no other process writes to `dir`.
   */
  staleTempMs?: number;
  /** fsync each entry file and its directory before a put resolves. Default: true. */
  fsync?: boolean;
  /** Period of the background expiry sweep in ms; 0 disables it. Default: 60000. */
  sweepIntervalMs?: number;
}

/** Counters of an {@link FsStore}: `entries`/`bytes` now, the rest since open. */
export interface FsStoreStats {
  /** Entries in the in-memory index now. */
  entries: number;
  /** Sum of the indexed entry file sizes in bytes now. */
  bytes: number;
  /** `get` calls that returned a value. */
  hits: number;
  /** `get` calls that returned null. */
  misses: number;
  /** Successful `put` calls. */
  puts: number;
  /** Entries removed to stay within `maxBytes`. */
  evictions: number;
  /** Entries removed because their TTL passed. */
  expirations: number;
  /** Stale temp files removed at open. */
  tempFilesRemoved: number;
  /** Files under `dir` at open that are neither entries nor temp files (left alone, not counted). */
  foreignFiles: number;
}

interface IndexEntry {
  /** Entry file size in bytes (header + payload). */
  size: number;
  /** Absolute expiry in ms since the epoch, or undefined for none. */
  expiresAt: number | undefined;
}

interface Header {
  expiresAt: number | undefined;
  payloadBytes: number;
}

/**
 * Directory-backed store. Open with {@link FsStore.open}.
 *
 * Recency for the LRU budget lives in an in-memory index (Map order) rebuilt at open from the
 * entry files' mtimes; a hit sets the file's mtime to `now()` so the order survives restarts.
 * Several FsStore instances (or processes) may share a directory safely — every entry is
 * replaced by an atomic rename, so readers see whole entries only — but each enforces the byte
 * budget over the entries it knows of (those found at open plus those it wrote or read since).
 */
export class FsStore implements SnapshotStore {
  /** Always `"fs"`. */
  readonly kind = "fs" as const;
  /** The store's root directory. */
  readonly dir: string;
  readonly #maxBytes: number | undefined;
  readonly #defaultTtlMs: number | undefined;
  readonly #now: () => number;
  readonly #fsync: boolean;
  readonly #index = new Map<string, IndexEntry>();
  readonly #locks = new Map<string, Promise<void>>();
  readonly #madeDirs = new Set<string>();
  #bytes = 0;
  #closed = false;
  #timer: ReturnType<typeof setInterval> | undefined;
  #stats = {
    hits: 0,
    misses: 0,
    puts: 0,
    evictions: 0,
    expirations: 0,
    tempFilesRemoved: 0,
    foreignFiles: 0,
  };

  private constructor(dir: string, opts: FsStoreOptions) {
    this.dir = dir;
    this.#maxBytes = validateBudget(opts.maxBytes);
    this.#defaultTtlMs = validateTtl(opts.defaultTtlMs, "defaultTtlMs");
    if (opts.now !== undefined && typeof opts.now !== "function") {
      throw new TypeError(`now must be a function returning ms, got ${typeof opts.now}`);
    }
    this.#now = opts.now ?? Date.now;
    this.#fsync = opts.fsync ?? true;
  }

  /**
   * Opens (creating if needed) a store rooted at `dir`: removes stale temp files and expired
   * entries, and rebuilds the index (recency from mtimes), evicting past `maxBytes`.
   * @param dir root directory; created with parents when missing
   * @param opts budget, TTL, clock, temp-file policy, fsync, sweep period
   * @returns the open store
   * @throws {TypeError} when `dir` is not a non-empty string
   * @throws {RangeError} on out-of-range options
   * @throws {StoreError} `io` when the directory cannot be created or read
   */
  static async open(dir: string, opts: FsStoreOptions = {}): Promise<FsStore> {
    if (typeof dir !== "string" || dir.length === 0) {
      throw new TypeError(`FsStore dir must be a non-empty string, got ${JSON.stringify(dir)}`);
    }
    const staleTempMs = opts.staleTempMs ?? 600_000;
    if (!Number.isSafeInteger(staleTempMs) || staleTempMs < 0) {
      throw new RangeError(`staleTempMs must be an integer ≥ 0, got ${staleTempMs}`);
    }
    const sweep = opts.sweepIntervalMs ?? 60_000;
    if (!Number.isInteger(sweep) || sweep < 0 || sweep > 2 ** 31 - 1) {
      throw new RangeError(`sweepIntervalMs must be an integer in 0..2^31-1, got ${sweep}`);
    }
    const store = new FsStore(dir, opts);
    try {
      await Deno.mkdir(dir, { recursive: true });
      await store.#scan(staleTempMs);
    } catch (e) {
      throw asIo(e, `cannot open FsStore at "${dir}"`);
    }
    await store.#evict(undefined);
    if (sweep > 0) {
      const timer = setInterval(() => {
        store.sweep().catch(() => {}); // errors surface on the next direct call instead
      }, sweep);
      Deno.unrefTimer(timer);
      store.#timer = timer;
    }
    return store;
  }

  /**
   * Removes every indexed entry whose TTL has passed (also runs every `sweepIntervalMs`).
   * @returns how many entries were removed
   * @throws {StoreError} `io` when a file cannot be removed
   */
  async sweep(): Promise<number> {
    this.#open();
    const now = this.#now();
    let removed = 0;
    for (const [key, e] of [...this.#index]) {
      if (e.expiresAt === undefined || e.expiresAt > now) continue;
      if (await this.#removeIfExpired(key)) removed++;
    }
    return removed;
  }

  /**
   * @returns a snapshot of the counters
   */
  stats(): FsStoreStats {
    return { entries: this.#index.size, bytes: this.#bytes, ...this.#stats };
  }

  /** {@inheritDoc SnapshotStore.put} */
  async put(key: string, value: Uint8Array, opts: PutOptions = {}): Promise<void> {
    this.#open();
    validateKey(key);
    validateValue(value);
    const ttl = validateTtl(opts.ttlMs) ?? this.#defaultTtlMs;
    const size = FS_ENTRY_HEADER_BYTES + value.byteLength;
    if (this.#maxBytes !== undefined && size > this.#maxBytes) {
      throw new StoreError(
        "too_large",
        "fs",
        `value for key "${key}" is ${value.byteLength} bytes (${size} with header), larger than the store's whole budget of ${this.#maxBytes} bytes`,
      );
    }
    await this.#withLock(key, async () => {
      const now = this.#now();
      const expiresAt = ttl === undefined ? undefined : now + ttl;
      const sub = this.#subdir(key);
      const final = `${sub}/${key}`;
      const temp = `${sub}/${TEMP_PREFIX}${Deno.pid}-${randomHex(8)}`;
      try {
        if (!this.#madeDirs.has(sub)) {
          await Deno.mkdir(sub, { recursive: true });
          this.#madeDirs.add(sub);
        }
        const file = await Deno.open(temp, { write: true, createNew: true, mode: 0o644 });
        try {
          await writeAll(file, encodeHeader(expiresAt, value.byteLength));
          await writeAll(file, value);
          const t = new Date(now);
          await file.utime(t, t); // recency on the store's clock
          if (this.#fsync) await file.sync();
        } finally {
          file.close();
        }
        await Deno.rename(temp, final);
        if (this.#fsync) await syncDir(sub);
      } catch (e) {
        await Deno.remove(temp).catch(() => {});
        throw asIo(e, `cannot write entry "${key}" at "${final}"`);
      }
      this.#setIndex(key, { size, expiresAt });
      this.#stats.puts++;
    });
    await this.#evict(key);
  }

  /** {@inheritDoc SnapshotStore.get} */
  async get(key: string): Promise<Uint8Array | null> {
    this.#open();
    validateKey(key);
    const path = this.#path(key);
    let data: Uint8Array;
    try {
      data = await Deno.readFile(path);
    } catch (e) {
      if (e instanceof Deno.errors.NotFound) {
        this.#dropIndex(key);
        this.#stats.misses++;
        return null;
      }
      throw asIo(e, `cannot read entry "${key}" at "${path}"`);
    }
    const h = decodeHeader(data, data.byteLength, path);
    if (h.expiresAt !== undefined && h.expiresAt <= this.#now()) {
      await this.#removeIfExpired(key);
      this.#stats.misses++;
      return null;
    }
    this.#stats.hits++;
    this.#setIndex(key, { size: data.byteLength, expiresAt: h.expiresAt });
    const t = new Date(this.#now());
    await Deno.utime(path, t, t).catch(() => {}); // recency only; a racing delete is fine
    return data.subarray(FS_ENTRY_HEADER_BYTES);
  }

  /** {@inheritDoc SnapshotStore.has} */
  async has(key: string): Promise<boolean> {
    this.#open();
    validateKey(key);
    const h = await this.#readHeader(this.#path(key));
    return h !== null && (h.expiresAt === undefined || h.expiresAt > this.#now());
  }

  /** {@inheritDoc SnapshotStore.delete} */
  async delete(key: string): Promise<boolean> {
    this.#open();
    validateKey(key);
    return await this.#withLock(key, async () => {
      const path = this.#path(key);
      const h = await this.#readHeader(path);
      if (h === null) {
        this.#dropIndex(key);
        return false;
      }
      await this.#unlink(key, path);
      return h.expiresAt === undefined || h.expiresAt > this.#now();
    });
  }

  /** {@inheritDoc SnapshotStore.close} */
  close(): Promise<void> {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    this.#closed = true;
    return Promise.resolve();
  }

  #open(): void {
    if (this.#closed) {
      throw new StoreError("unavailable", "fs", `FsStore at "${this.dir}" is closed`);
    }
  }

  #subdir(key: string): string {
    return `${this.dir}/${fan(key)}`;
  }

  #path(key: string): string {
    return `${this.#subdir(key)}/${key}`;
  }

  /** Runs `fn` after every earlier locked operation on `key` has settled (per-key mutex). */
  async #withLock<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.#locks.get(key) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((r) => (release = r));
    const tail = prev.then(() => mine);
    this.#locks.set(key, tail);
    await prev;
    try {
      return await fn();
    } finally {
      release();
      if (this.#locks.get(key) === tail) this.#locks.delete(key);
    }
  }

  #setIndex(key: string, e: IndexEntry): void {
    this.#dropIndex(key);
    this.#index.set(key, e); // most recent at the end
    this.#bytes += e.size;
  }

  #dropIndex(key: string): void {
    const old = this.#index.get(key);
    if (old) {
      this.#index.delete(key);
      this.#bytes -= old.size;
    }
  }

  /** Removes the entry file; returns whether the key was in the index (false if raced away). */
  async #unlink(key: string, path: string): Promise<boolean> {
    try {
      await Deno.remove(path);
    } catch (e) {
      if (!(e instanceof Deno.errors.NotFound)) {
        throw asIo(e, `cannot remove entry "${key}" at "${path}"`);
      }
    }
    const had = this.#index.has(key);
    this.#dropIndex(key);
    return had;
  }

  /** Under the key's lock, re-reads the header and removes the entry if it is still expired. */
  async #removeIfExpired(key: string): Promise<boolean> {
    return await this.#withLock(key, async () => {
      const path = this.#path(key);
      const h = await this.#readHeader(path);
      if (h === null) {
        this.#dropIndex(key);
        return false;
      }
      if (h.expiresAt === undefined || h.expiresAt > this.#now()) return false;
      await this.#unlink(key, path);
      this.#stats.expirations++;
      return true;
    });
  }

  /**
   * Removes least-recently-used entries past the budget, skipping `keep` and keys with an
   * operation in flight (so the budget can be exceeded briefly under heavy concurrent writes).
   */
  async #evict(keep: string | undefined): Promise<void> {
    if (this.#maxBytes === undefined || this.#bytes <= this.#maxBytes) return;
    await this.sweep();
    for (const key of [...this.#index.keys()]) {
      if (this.#bytes <= this.#maxBytes) break;
      if (key === keep || this.#locks.has(key) || !this.#index.has(key)) continue;
      if (await this.#unlink(key, this.#path(key))) this.#stats.evictions++;
    }
  }

  /** Header of the entry at `path`, or null when the file does not exist. */
  async #readHeader(path: string): Promise<Header | null> {
    let file: Deno.FsFile;
    try {
      file = await Deno.open(path, { read: true });
    } catch (e) {
      if (e instanceof Deno.errors.NotFound) return null;
      throw asIo(e, `cannot open entry at "${path}"`);
    }
    try {
      const buf = new Uint8Array(FS_ENTRY_HEADER_BYTES);
      let got = 0;
      while (got < buf.length) {
        const n = await file.read(buf.subarray(got));
        if (n === null) break;
        got += n;
      }
      const { size } = await file.stat();
      return decodeHeader(buf.subarray(0, got), size, path);
    } catch (e) {
      throw asIo(e, `cannot read entry header at "${path}"`);
    } finally {
      file.close();
    }
  }

  /** Walks `<dir>/<fan>/`: cleans temp files and expired entries, fills the index by mtime. */
  async #scan(staleTempMs: number): Promise<void> {
    const found: { key: string; mtime: number; size: number; expiresAt: number | undefined }[] = [];
    const wallNow = Date.now();
    for await (const top of Deno.readDir(this.dir)) {
      if (!top.isDirectory || !/^[0-9a-f]{2}$/.test(top.name)) {
        this.#stats.foreignFiles++;
        continue;
      }
      const sub = `${this.dir}/${top.name}`;
      this.#madeDirs.add(sub);
      for await (const f of Deno.readDir(sub)) {
        const path = `${sub}/${f.name}`;
        if (!f.isFile) {
          this.#stats.foreignFiles++;
          continue;
        }
        if (f.name.startsWith(TEMP_PREFIX)) {
          const st = await Deno.stat(path).catch(() => null);
          if (st && (staleTempMs === 0 || wallNow - (st.mtime?.getTime() ?? 0) >= staleTempMs)) {
            await Deno.remove(path).catch(() => {});
            this.#stats.tempFilesRemoved++;
          }
          continue;
        }
        if (!isKey(f.name) || fan(f.name) !== top.name) {
          this.#stats.foreignFiles++;
          continue;
        }
        const st = await Deno.stat(path);
        let h: Header | null;
        try {
          h = await this.#readHeader(path);
        } catch {
          this.#stats.foreignFiles++; // not ours (bad magic/version): leave it alone
          continue;
        }
        if (h === null) continue;
        if (h.expiresAt !== undefined && h.expiresAt <= this.#now()) {
          await Deno.remove(path).catch(() => {});
          this.#stats.expirations++;
          continue;
        }
        found.push({
          key: f.name,
          mtime: st.mtime?.getTime() ?? 0,
          size: st.size,
          expiresAt: h.expiresAt,
        });
      }
    }
    found.sort((a, b) => a.mtime - b.mtime || (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    for (const f of found) this.#setIndex(f.key, { size: f.size, expiresAt: f.expiresAt });
  }
}

function isKey(name: string): boolean {
  try {
    validateKey(name);
    return true;
  } catch {
    return false;
  }
}

/** 2 hex digits: FNV-1a-32 over the key's UTF-16 code units (ASCII here), low byte. */
function fan(key: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return (h & 0xff).toString(16).padStart(2, "0");
}

function randomHex(bytes: number): string {
  return hex(crypto.getRandomValues(new Uint8Array(bytes)));
}

function encodeHeader(expiresAt: number | undefined, payloadBytes: number): Uint8Array {
  const buf = new Uint8Array(FS_ENTRY_HEADER_BYTES);
  buf.set(MAGIC, 0);
  const v = new DataView(buf.buffer);
  v.setUint8(4, VERSION);
  v.setUint8(5, 0);
  v.setUint16(6, FS_ENTRY_HEADER_BYTES, true);
  v.setFloat64(8, expiresAt ?? 0, true);
  v.setBigUint64(16, BigInt(payloadBytes), true);
  return buf;
}

/**
 * Parses and checks an entry header against the file's size.
 * @throws {StoreError} `io` naming the path and the failed check
 */
function decodeHeader(buf: Uint8Array, fileBytes: number, path: string): Header {
  const bad = (why: string) =>
    new StoreError("io", "fs", `corrupt or foreign entry file "${path}": ${why}`);
  if (buf.byteLength < FS_ENTRY_HEADER_BYTES) {
    throw bad(`${buf.byteLength} bytes, shorter than the ${FS_ENTRY_HEADER_BYTES}-byte header`);
  }
  for (let i = 0; i < 4; i++) if (buf[i] !== MAGIC[i]) throw bad(`bad magic`);
  const v = new DataView(buf.buffer, buf.byteOffset, FS_ENTRY_HEADER_BYTES);
  const version = v.getUint8(4);
  if (version !== VERSION) throw bad(`version ${version}, this reader knows ${VERSION}`);
  const flags = v.getUint8(5);
  if (flags !== 0) throw bad(`flags ${flags}, expected 0`);
  const hlen = v.getUint16(6, true);
  if (hlen !== FS_ENTRY_HEADER_BYTES) throw bad(`header length ${hlen}, expected 24`);
  const exp = v.getFloat64(8, true);
  if (!Number.isFinite(exp) || exp < 0) throw bad(`expiresAt ${exp} is not a time`);
  const payload = v.getBigUint64(16, true);
  if (payload !== BigInt(fileBytes - FS_ENTRY_HEADER_BYTES)) {
    throw bad(`payload length ${payload} but the file holds ${fileBytes - hlen} payload bytes`);
  }
  return { expiresAt: exp === 0 ? undefined : exp, payloadBytes: Number(payload) };
}

async function writeAll(file: Deno.FsFile, data: Uint8Array): Promise<void> {
  let off = 0;
  while (off < data.byteLength) off += await file.write(data.subarray(off));
}

/** fsync a directory so a rename in it is durable (best effort where the OS refuses). */
async function syncDir(dir: string): Promise<void> {
  let d: Deno.FsFile | undefined;
  try {
    d = await Deno.open(dir, { read: true });
    await d.sync();
  } catch {
    // some platforms cannot open or fsync directories; the file itself was synced
  } finally {
    d?.close();
  }
}

function asIo(e: unknown, what: string): StoreError {
  if (e instanceof StoreError) return e;
  const msg = e instanceof Error ? e.message : String(e);
  return new StoreError("io", "fs", `${what}: ${msg}`, { cause: e });
}
