// NativeSequence: one token sequence with its native KV cache (kvr_seq) — prefill/decode
// (nonblocking FFI, one call in flight per sequence; short decode steps synchronous, see
// sync_step.ts), truncate, KV read/write, set length.
// Every argument is checked here before FFI; native failures become EngineError with the
// sequence's own message (kvr_seq_last_error, valid across threads). Created by NativeModel.

import { EngineError } from "./errors.ts";
import { DTYPE_CODE, ENCODING_CODE, type KvEncoding } from "./abi.ts";
import { checkInt, quoteValue } from "./check.ts";
import { assertKvDtype, dtypeByteSize, type KvDtype } from "./dtype.ts";
import { cString, type NativeLibrary } from "./library.ts";
import type { NativeModel } from "./model.ts";
import {
  type LogprobRequest,
  NativeSampler,
  type NativeSamplingOptions,
  SampleBuffers,
  type SampleResult,
} from "./sampler.ts";
import { chooseSync, eventLoopTurn, nonblockingDone, turnDue } from "./sync_step.ts";

/** Largest logits buffer a prefill may request, in f32 elements (4 GiB of memory). */
const MAX_LOGITS = 2 ** 30;

/**
 * @internal The EngineError for a failed call on a sequence: the message comes from
 * kvr_seq_last_error (set by whichever thread ran the call), else the thread-local one.
 * @param lib the library
 * @param seq the kvr_seq* the call ran on
 * @param status the negative kvr_status returned
 * @param call the C function name
 * @returns the error to throw
 */
export function sequenceError(
  lib: NativeLibrary,
  seq: Deno.PointerValue,
  status: number,
  call: string,
): EngineError {
  const msg = seq ? cString(lib.symbols.kvr_seq_last_error(seq)) : "";
  return new EngineError(status, msg || lib.lastError(), call);
}

function encodingCode(encoding: KvEncoding, fn: string): number {
  if (typeof encoding !== "string" || !Object.hasOwn(ENCODING_CODE, encoding)) {
    throw new TypeError(
      `${fn}: encoding must be one of ${Object.keys(ENCODING_CODE).join(", ")}, got ${
        quoteValue(encoding)
      }`,
    );
  }
  return ENCODING_CODE[encoding];
}

function checkFrame(fn: string, frame: Uint8Array): void {
  if (!(frame instanceof Uint8Array)) {
    throw new TypeError(`${fn}: frame must be a Uint8Array, got ${quoteValue(frame)}`);
  }
}

/** A sequence with a KV cache of fixed capacity (tokens) for every layer. */
export class NativeSequence {
  /** the model this sequence runs */
  readonly model: NativeModel;
  readonly #lib: NativeLibrary;
  #ptr: Deno.PointerObject | null;
  #inFlight = false;
  /** duration of the last decode/decodeSample (ms), Infinity before the first */
  #lastStepMs = Infinity;
  /** buffers a nonblocking call is reading/writing: referenced here until it settles */
  #pinned: ArrayBufferView[] = [];
  #freeRequested = false;
  readonly #onRelease: (seq: NativeSequence) => void;

  /** @internal use NativeModel.createSequence */
  constructor(
    model: NativeModel,
    lib: NativeLibrary,
    ptr: Deno.PointerObject,
    onRelease: (seq: NativeSequence) => void,
  ) {
    this.model = model;
    this.#lib = lib;
    this.#ptr = ptr;
    this.#onRelease = onRelease;
  }

  #handle(op: string): Deno.PointerObject {
    if (this.#freeRequested || this.#ptr === null) {
      throw new Error(`NativeSequence.${op}(): the sequence has been freed`);
    }
    if (this.#inFlight) {
      throw new Error(
        `NativeSequence.${op}(): a prefill/decode is still running on this sequence; await it first`,
      );
    }
    return this.#ptr;
  }

  /** Tokens currently in the cache. @throws Error when freed or busy */
  get length(): number {
    return this.#lib.symbols.kvr_seq_length(this.#handle("length"));
  }

  /** Maximum tokens the cache holds. @throws Error when freed or busy */
  get capacity(): number {
    return this.#lib.symbols.kvr_seq_capacity(this.#handle("capacity"));
  }

  /** KV blocks this sequence holds in its pool (0 for a contiguous cache). @throws Error when freed or busy */
  get blocks(): number {
    return this.#lib.symbols.kvr_seq_blocks(this.#handle("blocks"));
  }

  /**
   * The ids of the pool blocks this paged sequence holds, in position order (block i holds
   * positions [i·blockTokens, (i+1)·blockTokens)).
   * @returns the ids (a copy)
   * @throws EngineError for a contiguous sequence; Error when freed or busy
   */
  blockTable(): Uint32Array {
    const ptr = this.#handle("blockTable");
    const n = new Uint32Array(1);
    const ids = new Uint32Array(Math.max(1, this.#lib.symbols.kvr_seq_blocks(ptr)));
    const status = this.#lib.symbols.kvr_seq_block_table(ptr, ids, ids.length, n);
    if (status !== 0) this.#fail(status, "kvr_seq_block_table");
    return ids.slice(0, n[0]);
  }

  /**
   * Makes this empty paged sequence start from pool blocks that already hold the KV of its first
   * `nTokens` positions (a prefix-cache hit, a forked choice): each block gains a reference, no
   * KV is copied; a later write into a block another holder shares copies that block first.
   * @param ids distinct block ids of this sequence's pool, ceil(nTokens / blockTokens) of them
   * @param nTokens positions they hold (the new length), <= capacity
   * @throws RangeError for bad arguments; EngineError (INVALID_ARGUMENT when the sequence is not
   *   empty or a block is free); Error when freed or busy
   */
  adopt(ids: Uint32Array, nTokens: number): void {
    const ptr = this.#handle("adopt");
    checkInt("adopt(): nTokens", nTokens, 0, this.#lib.symbols.kvr_seq_capacity(ptr));
    const status = this.#lib.symbols.kvr_seq_adopt(ptr, ids, ids.length, nTokens);
    if (status !== 0) this.#fail(status, "kvr_seq_adopt");
  }

  /** Whether free() was called (the native cache may still await an in-flight call). */
  get freed(): boolean {
    return this.#freeRequested;
  }

  #fail(status: number, call: string): never {
    throw sequenceError(this.#lib, this.#ptr, status, call);
  }

  /** A single-token step ended: its duration picks the next step's call (sync_step.ts). */
  #stepDone(sync: boolean, t0: number): void {
    this.#lastStepMs = performance.now() - t0;
    if (!sync) nonblockingDone();
  }

  async #run(
    call: () => Promise<number> | number,
    name: string,
    pinned: ArrayBufferView[],
  ): Promise<void> {
    this.#inFlight = true;
    this.#pinned = pinned;
    let status: number;
    try {
      status = await call();
    } finally {
      this.#inFlight = false;
      this.#pinned = [];
    }
    if (status !== 0) this.#fail(status, name);
  }

  #settle(): void {
    if (this.#freeRequested) this.#release();
  }

  /**
   * Appends tokens at positions length..length+n-1 and computes logits.
   * The token and logits buffers stay referenced by this call until the promise settles.
   * @param tokens token ids, each an integer in [0, vocabSize); at least one
   * @param opts allPositions: return (n, vocab) row-major logits instead of the last row
   * @returns Float32Array of vocab (or n × vocab) logits
   * @throws TypeError/RangeError before FFI for empty input, bad ids or capacity overflow;
   *   EngineError when the native call fails; Error when freed or another call is in flight
   */
  async prefill(
    tokens: ArrayLike<number>,
    opts: { allPositions?: boolean } = {},
  ): Promise<Float32Array> {
    const ptr = this.#handle("prefill");
    if (tokens === null || typeof tokens !== "object" || typeof tokens.length !== "number") {
      throw new TypeError(
        `prefill(): tokens must be an array of token ids, got ${quoteValue(tokens)}`,
      );
    }
    const n = tokens.length;
    if (n < 1) throw new RangeError(`prefill(): tokens is empty (need at least 1 token)`);
    const vocab = this.model.config.vocabSize;
    const ids = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      ids[i] = checkInt(`prefill(): tokens[${i}]`, tokens[i], 0, vocab - 1);
    }
    const length = this.#lib.symbols.kvr_seq_length(ptr);
    const capacity = this.#lib.symbols.kvr_seq_capacity(ptr);
    if (length + n > capacity) {
      throw new RangeError(
        `prefill(): capacity exceeded: length ${length} + ${n} tokens > capacity ${capacity}`,
      );
    }
    const all = opts.allPositions === true;
    const logitsLen = all ? n * vocab : vocab;
    if (logitsLen > MAX_LOGITS) {
      throw new RangeError(
        `prefill(): allPositions logits for ${n} tokens × vocab ${vocab} exceed ${MAX_LOGITS} floats`,
      );
    }
    const logits = new Float32Array(logitsLen);
    try {
      await this.#run(
        () =>
          this.#lib.symbols.kvr_seq_prefill(
            ptr,
            ids,
            BigInt(n),
            all ? 1 : 0,
            logits,
            BigInt(logitsLen),
          ),
        "kvr_seq_prefill",
        [ids, logits],
      );
    } finally {
      this.#settle();
    }
    return logits;
  }

  /**
   * Appends one token and returns its logits.
   * @param token token id in [0, vocabSize)
   * @returns Float32Array of vocab logits
   * @throws TypeError/RangeError before FFI for a bad id or a full cache; EngineError when the
   *   native call fails; Error when freed or another call is in flight
   */
  async decode(token: number): Promise<Float32Array> {
    const ptr = this.#handle("decode");
    const vocab = this.model.config.vocabSize;
    checkInt("decode(): token", token, 0, vocab - 1);
    const length = this.#lib.symbols.kvr_seq_length(ptr);
    const capacity = this.#lib.symbols.kvr_seq_capacity(ptr);
    if (length + 1 > capacity) {
      throw new RangeError(
        `decode(): capacity exceeded: length ${length} + 1 token > capacity ${capacity}`,
      );
    }
    const logits = new Float32Array(vocab);
    const sync = chooseSync(this.#lastStepMs);
    const t0 = performance.now();
    try {
      await this.#run(
        () =>
          sync
            ? this.#lib.symbols.kvr_seq_decode_sync(ptr, token, logits, BigInt(vocab))
            : this.#lib.symbols.kvr_seq_decode(ptr, token, logits, BigInt(vocab)),
        "kvr_seq_decode",
        [logits],
      );
    } finally {
      this.#stepDone(sync, t0);
      this.#settle();
    }
    if (sync && turnDue()) await eventLoopTurn(this.#lib);
    return logits;
  }

  /**
   * A native sampler from this sequence's library, for {@link decodeSample}.
   * @param opts resolved sampling options (lib/engine validateSampling plus a seed)
   * @returns the sampler (the caller frees it)
   * @throws EngineError when an option is rejected
   */
  createSampler(opts: NativeSamplingOptions): NativeSampler {
    return NativeSampler.create(opts, this.#lib);
  }

  /**
   * Appends one token and samples the next one natively from its logits (which never reach
   * JavaScript): same token as `sampler.sample(await decode(token), width, req)`.
   * @param token token id in [0, vocabSize)
   * @param sampler the generation's sampler (busy until the promise settles)
   * @param width ids below width are candidates, 1..vocabSize (default vocabSize)
   * @param req logprobs to return (chosen token, top-n up to 64)
   * @returns the sampled token and the requested logprobs
   * @throws TypeError/RangeError before FFI for a bad id, width or request, or a full cache;
   *   EngineError when the native call fails; Error when freed, busy, or the sampler is busy/freed
   */
  async decodeSample(
    token: number,
    sampler: NativeSampler,
    width?: number,
    req: LogprobRequest = {},
  ): Promise<SampleResult> {
    const ptr = this.#handle("decodeSample");
    const vocab = this.model.config.vocabSize;
    checkInt("decodeSample(): token", token, 0, vocab - 1);
    const w = checkInt("decodeSample(): width", width ?? vocab, 1, vocab);
    const out = new SampleBuffers();
    const top = out.prepare(req);
    const length = this.#lib.symbols.kvr_seq_length(ptr);
    const capacity = this.#lib.symbols.kvr_seq_capacity(ptr);
    if (length + 1 > capacity) {
      throw new RangeError(
        `decodeSample(): capacity exceeded: length ${length} + 1 token > capacity ${capacity}`,
      );
    }
    const sp = sampler.acquire();
    const sync = chooseSync(this.#lastStepMs);
    const t0 = performance.now();
    try {
      const f = sync
        ? this.#lib.symbols.kvr_seq_decode_sample_sync
        : this.#lib.symbols.kvr_seq_decode_sample;
      await this.#run(
        () => f(ptr, token, sp, w, ...out.args(req, top)),
        "kvr_seq_decode_sample",
        [out.token, out.logprob, out.topIds, out.topLogprobs, out.topCount],
      );
    } finally {
      sampler.release();
      this.#stepDone(sync, t0);
      this.#settle();
    }
    const result = out.result(req, top);
    if (sync && turnDue()) await eventLoopTurn(this.#lib);
    return result;
  }

  /**
   * Rewinds the cache to its first nTokens tokens.
   * @param nTokens new length, 0..length
   * @throws RangeError when nTokens > length; EngineError on native failure
   */
  truncate(nTokens: number): void {
    const ptr = this.#handle("truncate");
    checkInt("truncate(): nTokens", nTokens, 0, this.#lib.symbols.kvr_seq_length(ptr));
    const status = this.#lib.symbols.kvr_seq_truncate(ptr, nTokens);
    if (status !== 0) this.#fail(status, "kvr_seq_truncate");
  }

  /**
   * Sets the length; the caller vouches that positions < nTokens hold K/V (after writeKv).
   * @param nTokens new length, 0..capacity
   * @throws RangeError when nTokens > capacity; EngineError on native failure
   */
  setLength(nTokens: number): void {
    const ptr = this.#handle("setLength");
    checkInt("setLength(): nTokens", nTokens, 0, this.#lib.symbols.kvr_seq_capacity(ptr));
    const status = this.#lib.symbols.kvr_seq_set_length(ptr, nTokens);
    if (status !== 0) this.#fail(status, "kvr_seq_set_length");
  }

  #kvBytes(count: number, dtype: KvDtype): number {
    const c = this.model.config;
    return c.numKvHeads * count * c.headDim * dtypeByteSize(dtype);
  }

  /**
   * Copies one layer's K and V for tokens [start, start+count), keys post-RoPE.
   * @param layer 0..numLayers-1
   * @param start first token
   * @param count tokens (start+count <= length; 0 gives empty buffers)
   * @param dtype buffer element type (default: the cache's kvDtype, which is bit-exact)
   * @returns k and v, each (kv_heads, count, head_dim) row-major bytes in dtype
   * @throws TypeError/RangeError for bad arguments; EngineError on native failure
   */
  readKv(
    layer: number,
    start: number,
    count: number,
    dtype: KvDtype = this.model.kvDtype,
  ): { k: Uint8Array; v: Uint8Array } {
    const ptr = this.#handle("readKv");
    assertKvDtype(dtype, "readKv(): dtype");
    checkInt("readKv(): layer", layer, 0, this.model.config.numLayers - 1);
    const length = this.#lib.symbols.kvr_seq_length(ptr);
    checkInt("readKv(): start", start, 0, length);
    checkInt("readKv(): count", count, 0, length - start);
    const bytes = this.#kvBytes(count, dtype);
    const k = new Uint8Array(bytes), v = new Uint8Array(bytes);
    if (count === 0) return { k, v };
    const status = this.#lib.symbols.kvr_seq_kv_read(
      ptr,
      layer,
      start,
      count,
      DTYPE_CODE[dtype],
      k,
      BigInt(bytes),
      v,
      BigInt(bytes),
    );
    if (status !== 0) this.#fail(status, "kvr_seq_kv_read");
    return { k, v };
  }

  /**
   * Writes one layer's K and V for tokens [start, start+count); length is unchanged (call
   * setLength once every layer of the range is written).
   * @param layer 0..numLayers-1
   * @param start first token, <= length
   * @param count tokens, start+count <= capacity
   * @param k (kv_heads, count, head_dim) bytes in dtype, keys post-RoPE
   * @param v (kv_heads, count, head_dim) bytes in dtype
   * @param dtype buffer element type (default: the cache's kvDtype)
   * @throws TypeError/RangeError for bad arguments or byte lengths; EngineError on native failure
   */
  writeKv(
    layer: number,
    start: number,
    count: number,
    k: Uint8Array,
    v: Uint8Array,
    dtype: KvDtype = this.model.kvDtype,
  ): void {
    const ptr = this.#handle("writeKv");
    assertKvDtype(dtype, "writeKv(): dtype");
    checkInt("writeKv(): layer", layer, 0, this.model.config.numLayers - 1);
    const length = this.#lib.symbols.kvr_seq_length(ptr);
    const capacity = this.#lib.symbols.kvr_seq_capacity(ptr);
    checkInt("writeKv(): start", start, 0, length);
    checkInt("writeKv(): count", count, 0, capacity - start);
    const bytes = this.#kvBytes(count, dtype);
    for (const [name, buf] of [["k", k], ["v", v]] as const) {
      if (!(buf instanceof Uint8Array)) {
        throw new TypeError(`writeKv(): ${name} must be a Uint8Array, got ${quoteValue(buf)}`);
      }
      if (buf.length !== bytes) {
        throw new RangeError(
          `writeKv(): ${name} has ${buf.length} bytes, expected ${bytes} (kv_heads ${this.model.config.numKvHeads} × count ${count} × head_dim ${this.model.config.headDim} × ${dtype})`,
        );
      }
    }
    if (count === 0) return;
    // FFI needs a fixed, non-shared ArrayBuffer: copy anything else
    const plain = (b: Uint8Array) =>
      b.buffer instanceof ArrayBuffer && !b.buffer.resizable ? b : new Uint8Array(b);
    k = plain(k);
    v = plain(v);
    const status = this.#lib.symbols.kvr_seq_kv_write(
      ptr,
      layer,
      start,
      count,
      DTYPE_CODE[dtype],
      k,
      BigInt(bytes),
      v,
      BigInt(bytes),
    );
    if (status !== 0) this.#fail(status, "kvr_seq_kv_write");
  }

  /**
   * Bytes of one unsigned snapshot chunk frame of `tokens` tokens (docs/snapshot-format.md §1.3).
   * @param encoding chunk encoding
   * @param groupSize q4 group (1..1024), 0 for every other encoding
   * @param tokens tokens in the chunk, >= 1
   * @returns the frame length in bytes (index, tokens, payload, CRC32C; no HMAC tag)
   * @throws TypeError/RangeError for bad arguments; EngineError on native failure
   */
  chunkBytes(encoding: KvEncoding, groupSize: number, tokens: number): number {
    const ptr = this.#handle("chunkBytes");
    const code = encodingCode(encoding, "chunkBytes()");
    checkInt("chunkBytes(): tokens", tokens, 1, 0xffffffff);
    checkInt("chunkBytes(): groupSize", groupSize, 0, 1024);
    const out = new BigUint64Array(1);
    const status = this.#lib.symbols.kvr_seq_chunk_bytes(ptr, code, groupSize, tokens, out);
    if (status !== 0) this.#fail(status, "kvr_seq_chunk_bytes");
    return Number(out[0]);
  }

  /**
   * Encodes positions [start, start+tokens) of every layer as snapshot chunk `index` into
   * `frame`, natively (the backend reads its own cache: no KV crosses into JavaScript). Same
   * bytes as the reference encodeChunk over readKv (tests/reference/chunk.ts).
   * @param encoding chunk encoding
   * @param groupSize q4 group (1..1024), 0 for every other encoding
   * @param index chunk index stored in the frame
   * @param start first position (start+tokens <= length)
   * @param tokens tokens in the chunk, >= 1
   * @param frame exactly chunkBytes(encoding, groupSize, tokens) bytes, written
   * @throws TypeError/RangeError for bad arguments; EngineError on native failure (INVALID_ARGUMENT
   *   for non-finite KV under q8/q4)
   */
  exportChunkFrame(
    encoding: KvEncoding,
    groupSize: number,
    index: number,
    start: number,
    tokens: number,
    frame: Uint8Array,
  ): void {
    const ptr = this.#handle("exportChunkFrame");
    const code = encodingCode(encoding, "exportChunkFrame()");
    checkInt("exportChunkFrame(): index", index, 0, 0xffffffff);
    const length = this.#lib.symbols.kvr_seq_length(ptr);
    checkInt("exportChunkFrame(): start", start, 0, length);
    checkInt("exportChunkFrame(): tokens", tokens, 1, length - start);
    checkFrame("exportChunkFrame()", frame);
    const status = this.#lib.symbols.kvr_seq_export_chunk(
      ptr,
      code,
      groupSize,
      index,
      start,
      tokens,
      frame,
      BigInt(frame.length),
    );
    if (status !== 0) this.#fail(status, "kvr_seq_export_chunk");
  }

  /**
   * Checks and imports snapshot chunk frame `index` into positions [start, start+tokens) of every
   * layer, natively, then sets the length to start+tokens. Nothing is written when a check fails.
   * @param encoding chunk encoding
   * @param groupSize q4 group (1..1024), 0 for every other encoding
   * @param index the chunk index the frame must carry
   * @param start first position (<= length; start+tokens <= capacity)
   * @param tokens tokens in the chunk, >= 1 (the frame must carry it)
   * @param frame the unsigned frame (no HMAC tag), chunkBytes(...) bytes
   * @throws TypeError/RangeError for bad arguments; EngineError CHECKSUM (CRC32C mismatch),
   *   CORRUPT (stored index/tokens, scales or mins), INVALID_ARGUMENT (frame length)
   */
  importChunkFrame(
    encoding: KvEncoding,
    groupSize: number,
    index: number,
    start: number,
    tokens: number,
    frame: Uint8Array,
  ): void {
    const ptr = this.#handle("importChunkFrame");
    const code = encodingCode(encoding, "importChunkFrame()");
    checkInt("importChunkFrame(): index", index, 0, 0xffffffff);
    const length = this.#lib.symbols.kvr_seq_length(ptr);
    const capacity = this.#lib.symbols.kvr_seq_capacity(ptr);
    checkInt("importChunkFrame(): start", start, 0, length);
    checkInt("importChunkFrame(): tokens", tokens, 1, capacity - start);
    checkFrame("importChunkFrame()", frame);
    const plain = frame.buffer instanceof ArrayBuffer && !frame.buffer.resizable
      ? frame
      : new Uint8Array(frame);
    const status = this.#lib.symbols.kvr_seq_import_chunk(
      ptr,
      code,
      groupSize,
      index,
      start,
      tokens,
      plain,
      BigInt(plain.length),
    );
    if (status !== 0) this.#fail(status, "kvr_seq_import_chunk");
  }

  /**
   * @internal For native calls that take this sequence's kvr_seq* next to other handles (the
   * sequence → sequence projection in lib/migrate): runs `call` with the pointer and holds the
   * sequence busy (every other call throws) until its promise settles, then performs a free()
   * requested meanwhile. The caller checks its arguments and interprets the result.
   * @param op the caller's name, for the freed/busy errors
   * @param call starts the native call
   * @returns what call's promise resolved to
   * @throws Error when the sequence is freed or another call is in flight
   */
  async runWithHandle<T>(op: string, call: (ptr: Deno.PointerObject) => Promise<T>): Promise<T> {
    const ptr = this.#handle(op);
    this.#inFlight = true;
    try {
      return await call(ptr);
    } finally {
      this.#inFlight = false;
      this.#settle();
    }
  }

  /**
   * @internal For a call that holds many sequences at once (the batched step, batch.ts): marks
   * this sequence busy (every other call throws) and returns its pointer; {@link endHold} ends
   * it and performs a free() requested meanwhile.
   * @param op the caller's name, for the freed/busy errors
   * @returns the kvr_seq pointer
   * @throws Error when the sequence is freed or another call is in flight
   */
  beginHold(op: string): Deno.PointerObject {
    const ptr = this.#handle(op);
    this.#inFlight = true;
    return ptr;
  }

  /** @internal Ends a {@link beginHold}. */
  endHold(): void {
    this.#inFlight = false;
    this.#settle();
  }

  #release(): void {
    if (this.#ptr === null) return;
    this.#lib.symbols.kvr_seq_free(this.#ptr);
    this.#ptr = null;
    this.#onRelease(this);
  }

  /** Frees the native cache (deferred until an in-flight call settles). Idempotent. */
  free(): void {
    if (this.#freeRequested) return;
    this.#freeRequested = true;
    if (!this.#inFlight) this.#release();
  }

  /** Same as free(). */
  [Symbol.dispose](): void {
    this.free();
  }
}
