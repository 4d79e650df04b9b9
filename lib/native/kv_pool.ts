// KvPool: one model's paged KV pool (kvr_kv_pool) — fixed-size blocks shared by the model's
// paged sequences, which take blocks as they grow and give them back on truncate/free, and
// references on shared blocks (the prefix cache). Counts for admission and metrics. Created by NativeModel.createKvPool; not the scheduler (lib/serve).

import type { NativeLibrary } from "./library.ts";
import type { NativeModel } from "./model.ts";
import type { NativeSequence } from "./sequence.ts";

/** A model's arena of KV blocks (see native/include/kvrelay.h "Paged KV pool"). */
export class KvPool {
  /** the model whose sequences use this pool */
  readonly model: NativeModel;
  /** blocks in the pool */
  readonly blocksTotal: number;
  /** positions per block */
  readonly blockTokens: number;
  /** bytes of one block (every layer's K and V for blockTokens positions) */
  readonly blockBytes: number;
  readonly #lib: NativeLibrary;
  #ptr: Deno.PointerObject | null;
  readonly #create: (capacity: number) => NativeSequence;
  readonly #onFree: () => void;

  /** @internal use NativeModel.createKvPool */
  constructor(
    model: NativeModel,
    lib: NativeLibrary,
    ptr: Deno.PointerObject,
    create: (capacity: number) => NativeSequence,
    onFree: () => void,
  ) {
    this.model = model;
    this.#lib = lib;
    this.#ptr = ptr;
    this.#create = create;
    this.#onFree = onFree;
    this.blocksTotal = lib.symbols.kvr_kv_pool_blocks_total(ptr);
    this.blockTokens = lib.symbols.kvr_kv_pool_block_tokens(ptr);
    this.blockBytes = Number(lib.symbols.kvr_kv_pool_block_bytes(ptr));
  }

  #handle(op: string): Deno.PointerObject {
    if (this.#ptr === null) throw new Error(`KvPool.${op}(): the pool has been freed`);
    return this.#ptr;
  }

  /** Whether the pool was freed (its model was freed: the runtime closed). */
  get freed(): boolean {
    return this.#ptr === null;
  }

  /** Blocks free now. @throws Error when freed */
  get blocksFree(): number {
    return this.#lib.symbols.kvr_kv_pool_blocks_free(this.#handle("blocksFree"));
  }

  /**
   * A paged sequence holding no block yet.
   * @param capacity most tokens it may ever hold (a logical bound; memory comes block by block)
   * @returns the sequence
   * @throws RangeError for a bad capacity; EngineError from native; Error when freed
   */
  createSequence(capacity: number): NativeSequence {
    this.#handle("createSequence");
    return this.#create(capacity);
  }

  /**
   * Adds one reference to each block (the prefix cache holding cached blocks): a block returns
   * to the free list only when no sequence and no reference holds it. All or none.
   * @param ids held block ids (a free block cannot be referenced)
   * @throws EngineError (OUT_OF_RANGE, INVALID_ARGUMENT for a free block); Error when freed
   */
  ref(ids: Uint32Array): void {
    const ptr = this.#handle("ref");
    this.#lib.check(this.#lib.symbols.kvr_kv_pool_ref(ptr, ids, ids.length), "kvr_kv_pool_ref");
  }

  /**
   * Drops one reference from each block (what ref added); a block nothing else holds returns to
   * the free list. All or none.
   * @param ids block ids, each with at least as many references as it appears
   * @throws EngineError (OUT_OF_RANGE, INVALID_ARGUMENT); Error when freed
   */
  unref(ids: Uint32Array): void {
    const ptr = this.#handle("unref");
    this.#lib.check(this.#lib.symbols.kvr_kv_pool_unref(ptr, ids, ids.length), "kvr_kv_pool_unref");
  }

  /** Releases the handle; the arena lives on until its last sequence is freed. Idempotent. */
  free(): void {
    if (this.#ptr === null) return;
    this.#lib.symbols.kvr_kv_pool_free(this.#ptr);
    this.#ptr = null;
    this.#onFree();
  }
}
