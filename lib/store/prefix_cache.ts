// Prefix cache: full `chunkTokens`-token chunks of prompt KV stored as one-chunk snapshots under
// chained SHA-256 keys (parent key ‖ u32le token ids), seeded by the model fingerprint and a
// server-side tenant salt; prefillWithCache reuses the longest cached chunk prefix, prefills the
// rest and stores the new full chunks. Not a store (SnapshotStore) nor the snapshot format.

import type { LoadedModel } from "../engine/mod.ts";
import type { NativeSequence } from "../native/mod.ts";
import {
  checkCompatible,
  decodeSnapshot,
  defaultKvCodec,
  exportSnapshot,
  nativeSink,
  type SnapshotEncoding,
  SnapshotError,
} from "../snapshot/mod.ts";
import type { SnapshotStore } from "./store.ts";
import { hex, sha256 } from "../util/mod.ts";

const SEED_DOMAIN = new TextEncoder().encode("kvrelay-prefix-cache-v1\0");

/** Options of a PrefixCache. */
export interface PrefixCacheOptions {
  /** Where chunks live (any SnapshotStore). */
  store: SnapshotStore;
  /** The model whose KV is cached; its fingerprint seeds every key. */
  model: LoadedModel;
  /** Server-side secret per tenant (>= 1 byte): tenants never share or probe each other's keys. */
  tenantSalt: Uint8Array | string;
  /** Tokens per cached chunk (default 256). */
  chunkTokens?: number;
  /** Encoding of stored chunks (default: the cache's own dtype, so reuse is bit-exact). */
  encoding?: SnapshotEncoding;
  /** TTL of stored chunks in ms (default: the store's). */
  ttlMs?: number;
  /** Store key prefix (default "pfx:"). */
  keyPrefix?: string;
}

/** Counters (cumulative). */
export interface PrefixCacheStats {
  /** Chunks served from the store. */
  hits: number;
  /** Eligible full chunks that were not in the store (and were prefilled). */
  misses: number;
  /** Stored entries refused on read (bad CRC, other tokens, foreign model): treated as misses. */
  rejected: number;
  /** Tokens whose KV came from the store. */
  reusedTokens: number;
  /** Tokens prefilled by the model. */
  prefilledTokens: number;
  /** Chunks written to the store. */
  stored: number;
}

/** What one prefillWithCache did. */
export interface PrefillResult {
  /** Logits after the last token, (vocab) f32. */
  logits: Float32Array;
  reusedTokens: number;
  prefilledTokens: number;
}

/** A prefix cache for one model and tenant over one store. */
export class PrefixCache {
  readonly store: SnapshotStore;
  readonly model: LoadedModel;
  readonly chunkTokens: number;
  readonly encoding: SnapshotEncoding;
  /** Cumulative counters. */
  readonly stats: PrefixCacheStats = {
    hits: 0,
    misses: 0,
    rejected: 0,
    reusedTokens: 0,
    prefilledTokens: 0,
    stored: 0,
  };
  readonly #salt: Uint8Array;
  readonly #ttlMs: number | undefined;
  readonly #prefix: string;
  #seed: Promise<Uint8Array> | null = null;

  /**
   * @param opts store, model, tenant salt, chunk size, encoding, TTL
   * @throws TypeError for an empty salt; RangeError for a bad chunk size
   */
  constructor(opts: PrefixCacheOptions) {
    this.store = opts.store;
    this.model = opts.model;
    this.chunkTokens = opts.chunkTokens ?? 256;
    if (!Number.isInteger(this.chunkTokens) || this.chunkTokens < 1 || this.chunkTokens > 65536) {
      throw new RangeError(`chunkTokens must be in [1, 65536], got ${this.chunkTokens}`);
    }
    this.encoding = opts.encoding ?? opts.model.native.kvDtype;
    this.#salt = typeof opts.tenantSalt === "string"
      ? new TextEncoder().encode(opts.tenantSalt)
      : opts.tenantSalt.slice();
    if (this.#salt.length === 0) throw new TypeError("tenantSalt must not be empty");
    this.#ttlMs = opts.ttlMs;
    this.#prefix = opts.keyPrefix ?? "pfx:";
  }

  /**
   * The same cache seen by one tenant: keys are seeded by this cache's salt and the tenant id
   * (length-prefixed, so distinct (salt, tenant) pairs never collide), so tenants never share,
   * hit or probe each other's entries. Counters are the view's own.
   * @param tenant the tenant's id (any string, e.g. an API key's identity and a cache_salt)
   * @returns a cache over the same store and model for that tenant
   */
  forTenant(tenant: string): PrefixCache {
    const t = new TextEncoder().encode(tenant);
    const salt = new Uint8Array(8 + this.#salt.length + t.length);
    const dv = new DataView(salt.buffer);
    dv.setUint32(0, this.#salt.length, true);
    salt.set(this.#salt, 4);
    dv.setUint32(4 + this.#salt.length, t.length, true);
    salt.set(t, 8 + this.#salt.length);
    return new PrefixCache({
      store: this.store,
      model: this.model,
      tenantSalt: salt,
      chunkTokens: this.chunkTokens,
      encoding: this.encoding,
      ttlMs: this.#ttlMs,
      keyPrefix: this.#prefix,
    });
  }

  /**
   * The seed every key of this cache (and of its tier's in-pool block cache) chains from:
   * SHA-256(domain ‖ u32le len ‖ model fingerprint ‖ u32le len ‖ tenant salt). Two views share a
   * seed only for the same model and tenant.
   * @returns 32 bytes
   */
  keySeed(): Promise<Uint8Array> {
    this.#seed ??= (() => {
      const fp = new TextEncoder().encode(this.model.fingerprint);
      const len = (x: number) => new Uint8Array(new Uint32Array([x]).buffer);
      return sha256(SEED_DOMAIN, len(fp.length), fp, len(this.#salt.length), this.#salt);
    })();
    return this.#seed;
  }

  /**
   * Keys of the full chunks of `tokens`: k_0 = SHA-256(seed ‖ ids_0), k_i = SHA-256(k_{i-1} ‖
   * ids_i), ids as u32 little-endian; seed = SHA-256(domain ‖ u32le len ‖ model fingerprint ‖
   * u32le len ‖ tenant salt).
   * @param tokens token ids
   * @param nChunks how many leading full chunks (default all)
   * @returns store keys, one per full chunk
   */
  async chunkKeys(tokens: ArrayLike<number>, nChunks?: number): Promise<string[]> {
    const n = Math.min(nChunks ?? Infinity, Math.floor(tokens.length / this.chunkTokens));
    let parent = await this.keySeed();
    const keys: string[] = [];
    for (let i = 0; i < n; i++) {
      const ids = new Uint8Array(4 * this.chunkTokens);
      const dv = new DataView(ids.buffer);
      for (let j = 0; j < this.chunkTokens; j++) {
        dv.setUint32(4 * j, tokens[i * this.chunkTokens + j], true);
      }
      parent = await sha256(parent, ids);
      keys.push(this.#prefix + hex(parent));
    }
    return keys;
  }

  /**
   * Writes one encoded chunk under its key (with the cache's TTL) and counts it.
   * @throws StoreError from the store
   */
  async storeChunk(key: string, bytes: Uint8Array): Promise<void> {
    await this.store.put(key, bytes, this.#ttlMs === undefined ? {} : { ttlMs: this.#ttlMs });
    this.stats.stored++;
  }

  /**
   * Imports chunk `index` (positions index·C..) from `bytes` into `seq` when it is exactly the
   * chunk of `tokens` at that position for this model. seq.length must be index·C.
   * @returns true when imported; false (and counts `rejected`) when the entry is unusable
   */
  async importChunk(
    seq: NativeSequence,
    bytes: Uint8Array,
    tokens: ArrayLike<number>,
    index: number,
  ): Promise<boolean> {
    const C = this.chunkTokens;
    try {
      await decodeSnapshot(bytes, {
        onHeader: (h) => {
          checkCompatible(this.model, h);
          const same = h.positionOffset === index * C && h.tokenIds.length === C &&
            h.encoding === this.encoding &&
            h.tokenIds.every((t, j) => t === tokens[index * C + j]);
          if (!same) {
            throw new SnapshotError(
              "format",
              `prefix chunk ${index} holds other tokens, positions or encoding`,
            );
          }
          return nativeSink(seq);
        },
      }, { maxBytes: 1 << 30, codec: defaultKvCodec() });
      return true;
    } catch (e) {
      if (!(e instanceof SnapshotError)) throw e;
      this.stats.rejected++;
      if (seq.length > index * C) seq.truncate(index * C);
      return false;
    }
  }
}

/**
 * Prefills `tokens` into the empty sequence `seq`, reusing the longest prefix of full chunks found
 * in the cache (at least one token is always prefilled, for the logits), then stores the prompt's
 * full chunks that were not cached.
 * @param cache the prefix cache (its model must own `seq`)
 * @param seq an empty sequence with capacity >= tokens.length
 * @param tokens prompt token ids (at least 1)
 * @param prefillRest computes the tokens after the reused prefix (default seq.prefill of them);
 *   a serving tier passes its scheduler so the prompt runs in batched steps
 * @returns last-token logits and how many tokens were reused / prefilled
 * @throws RangeError for an empty prompt or non-empty sequence; EngineError from native calls;
 *   StoreError from the store (reads and writes)
 */
export async function prefillWithCache(
  cache: PrefixCache,
  seq: NativeSequence,
  tokens: number[],
  prefillRest?: (reusedTokens: number) => Promise<Float32Array>,
): Promise<PrefillResult> {
  if (tokens.length < 1) throw new RangeError("prefillWithCache(): tokens is empty");
  if (seq.length !== 0) {
    throw new RangeError(`prefillWithCache(): the sequence must be empty, it holds ${seq.length}`);
  }
  if (seq.model !== cache.model.native) {
    throw new TypeError("prefillWithCache(): the sequence belongs to another model");
  }
  const C = cache.chunkTokens;
  const eligible = Math.floor((tokens.length - 1) / C);
  const allFull = Math.floor(tokens.length / C);
  const keys = await cache.chunkKeys(tokens, allFull);
  let reused = 0;
  for (let i = 0; i < eligible; i++) {
    const bytes = await cache.store.get(keys[i]);
    if (bytes === null || !(await cache.importChunk(seq, bytes, tokens, i))) break;
    reused++;
  }
  cache.stats.hits += reused;
  cache.stats.misses += eligible - reused;
  const reusedTokens = reused * C;
  const logits = prefillRest
    ? await prefillRest(reusedTokens)
    : await seq.prefill(tokens.slice(reusedTokens));
  cache.stats.reusedTokens += reusedTokens;
  cache.stats.prefilledTokens += tokens.length - reusedTokens;
  await storeChunks(cache, seq, tokens, reused, keys);
  return { logits, reusedTokens, prefilledTokens: tokens.length - reusedTokens };
}

/**
 * Stores the full chunks of the prompt in `seq` from chunk `from` on (exported from its KV).
 * @param cache the prefix cache (its model must own `seq`)
 * @param seq a sequence holding at least the prompt's full chunks
 * @param tokens the prompt's token ids
 * @param from the first chunk to store (those before it are in the store already)
 * @param keys the chunk keys (default: computed)
 * @throws EngineError from native calls; StoreError from the store
 */
export async function storeChunks(
  cache: PrefixCache,
  seq: NativeSequence,
  tokens: number[],
  from: number,
  keys?: string[],
): Promise<void> {
  const C = cache.chunkTokens;
  const allFull = Math.floor(tokens.length / C);
  if (from >= allFull) return;
  const k = keys ?? await cache.chunkKeys(tokens, allFull);
  for (let i = from; i < allFull; i++) {
    const bytes = await exportSnapshot(cache.model, seq, {
      tokens: tokens.slice(i * C, (i + 1) * C),
      start: i * C,
      end: (i + 1) * C,
      encoding: cache.encoding,
      chunkTokens: C,
    });
    await cache.storeChunk(k[i], bytes);
  }
}
