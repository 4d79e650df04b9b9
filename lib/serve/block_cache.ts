// The prefix cache inside a tier's KV pool: names for full pool blocks of prompt KV, keyed by
// chained SHA-256 over (parent key, the block's token ids) from a seed that binds the model
// fingerprint and the tenant salt (PrefixCache.keySeed). The cache holds one pool reference per
// cached block; a hit adopts the cached blocks into a new sequence (no KV copied) and prefills only
// the tail. Entries no live sequence uses are evicted least recently used first (eviction =
// unref), under pool pressure before the scheduler runs out of blocks. Not the snapshot-store
// prefix cache (lib/store/prefix_cache.ts, the cross-process second tier) nor the pool (native).

import type { KvPool, NativeSequence } from "../native/mod.ts";
import { hex, sha256 } from "../util/mod.ts";

const DOMAIN = new TextEncoder().encode("kvrelay-pool-block-v1\0");

/** One cached full block. */
interface Entry {
  readonly key: string;
  readonly block: number;
  /** live sequences whose table holds this block through the cache (adopted or inserted) */
  users: number;
}

/** Counters of a BlockCache (cumulative, except `blocks`). */
export interface BlockCacheStats {
  /** lookups that adopted at least one block */
  hits: number;
  /** blocks adopted by hits (shared, no copy) */
  sharedBlocks: number;
  /** KV bytes copied to serve hits: always 0 (hits share blocks) */
  copiedBytes: number;
  /** blocks inserted */
  inserted: number;
  /** blocks evicted */
  evicted: number;
}

/** What a sequence took from the cache: give it back with {@link BlockCache.release}. */
export interface BlockLease {
  /** tokens of the sequence whose KV came from cached blocks */
  readonly reusedTokens: number;
  /** the entries the sequence holds through the cache */
  readonly entries: Entry[];
}

/** The prefix cache of one pool (shared by every tenant: keys carry the tenant). */
export class BlockCache {
  readonly pool: KvPool;
  readonly stats: BlockCacheStats = {
    hits: 0,
    sharedBlocks: 0,
    copiedBytes: 0,
    inserted: 0,
    evicted: 0,
  };
  /** every entry, least recently used first (Map order: a touch deletes and re-adds) */
  readonly #entries = new Map<string, Entry>();
  #idle = 0; // entries with users === 0

  /** @param pool the tier's pool; every cached block is one of its blocks */
  constructor(pool: KvPool) {
    this.pool = pool;
  }

  /** Blocks the cache holds a reference to. */
  get blocks(): number {
    return this.#entries.size;
  }

  /** Cached blocks no live sequence uses: evicting them frees their pool blocks. */
  get evictable(): number {
    return this.#idle;
  }

  /**
   * Keys of the first `n` full blocks of `tokens`: k_0 = SHA-256(SHA-256(domain ‖ seed) ‖ ids_0),
   * k_i = SHA-256(k_{i-1} ‖ ids_i), ids as u32 little-endian.
   * @param seed the tenant's key seed (model fingerprint and tenant salt: PrefixCache.keySeed)
   * @param tokens token ids
   * @param n how many leading full blocks (at most tokens.length / blockTokens)
   * @returns one key per block
   */
  async keys(seed: Uint8Array, tokens: ArrayLike<number>, n: number): Promise<string[]> {
    const bt = this.pool.blockTokens;
    const count = Math.min(n, Math.floor(tokens.length / bt));
    let parent = await sha256(DOMAIN, seed);
    const out: string[] = [];
    const ids = new Uint8Array(4 * bt);
    const dv = new DataView(ids.buffer);
    for (let i = 0; i < count; i++) {
      for (let j = 0; j < bt; j++) dv.setUint32(4 * j, tokens[i * bt + j], true);
      parent = await sha256(parent, ids);
      out.push(hex(parent));
    }
    return out;
  }

  /**
   * Makes the empty paged sequence `seq` start from the longest run of cached blocks that begins
   * the prompt (no copy: the sequence adopts them). Call {@link release} with the lease when the
   * sequence is freed.
   * @param seq an empty sequence of this pool
   * @param keys the prompt's block keys, those a hit may cover (leave the last token out)
   * @returns the lease (reusedTokens 0 on a miss)
   * @throws EngineError from the adoption
   */
  adopt(seq: NativeSequence, keys: readonly string[]): BlockLease {
    const entries: Entry[] = [];
    for (const k of keys) {
      const e = this.#entries.get(k);
      if (!e) break;
      entries.push(e);
    }
    if (entries.length === 0) return { reusedTokens: 0, entries };
    const reused = entries.length * this.pool.blockTokens;
    seq.adopt(Uint32Array.from(entries, (e) => e.block), reused);
    // Children are touched before their parents, so a parent is never older than its children
    // and eviction takes a chain from its end.
    for (let i = entries.length - 1; i >= 0; i--) this.#use(entries[i]);
    this.stats.hits++;
    this.stats.sharedBlocks += entries.length;
    return { reusedTokens: reused, entries };
  }

  /**
   * Caches the full blocks of `seq` from block `from` on (after its prompt prefill), each under
   * its key unless that key is cached already, and adds them to the lease.
   * @param seq the sequence holding the prompt (paged, of this pool)
   * @param keys keys of the prompt's full blocks (all of them)
   * @param lease what the sequence took from the cache so far
   * @returns the lease with the inserted entries (release it when the sequence is freed)
   * @throws EngineError from the pool
   */
  insert(seq: NativeSequence, keys: readonly string[], lease: BlockLease): BlockLease {
    const table = seq.blockTable();
    const entries = lease.entries.slice();
    const fresh: Entry[] = [];
    for (let i = lease.entries.length; i < keys.length && i < table.length; i++) {
      if (this.#entries.has(keys[i])) continue;
      fresh.push({ key: keys[i], block: table[i], users: 1 });
    }
    if (fresh.length === 0) return lease;
    this.pool.ref(Uint32Array.from(fresh, (e) => e.block));
    for (let i = fresh.length - 1; i >= 0; i--) this.#entries.set(fresh[i].key, fresh[i]);
    this.stats.inserted += fresh.length;
    entries.push(...fresh);
    return { reusedTokens: lease.reusedTokens, entries };
  }

  /**
   * Another sequence holds the lease's blocks too (a fork adopted them): its entries stay in use
   * until both release it.
   * @param lease what adopt/insert returned
   */
  retain(lease: BlockLease): void {
    for (const e of lease.entries) this.#use(e);
  }

  /**
   * The sequence holding a lease is gone (freed): its entries may become evictable.
   * @param lease what adopt/insert returned
   */
  release(lease: BlockLease): void {
    for (const e of lease.entries) {
      if (e.users > 0 && --e.users === 0 && this.#entries.get(e.key) === e) this.#idle++;
    }
  }

  /**
   * Drops up to `n` cached blocks no live sequence uses, least recently used first; each frees
   * its pool block.
   * @param n blocks wanted
   * @returns blocks evicted
   */
  evict(n: number): number {
    const out: Entry[] = [];
    for (const e of this.#entries.values()) {
      if (out.length >= n) break;
      if (e.users === 0) out.push(e);
    }
    if (out.length === 0) return 0;
    for (const e of out) this.#entries.delete(e.key);
    this.#idle -= out.length;
    this.pool.unref(Uint32Array.from(out, (e) => e.block));
    this.stats.evicted += out.length;
    return out.length;
  }

  /** Drops every entry no live sequence uses (tests, shutdown). @returns blocks evicted */
  clear(): number {
    return this.evict(Infinity);
  }

  #use(e: Entry): void {
    if (e.users++ === 0) this.#idle--;
    this.#entries.delete(e.key);
    this.#entries.set(e.key, e);
  }
}
