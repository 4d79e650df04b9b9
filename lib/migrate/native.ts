// Typed wrappers of libkvrelay's cross-model KV projection section (kvrelay.h): cache↔feature
// block transforms (RoPE strip/re-apply), the float64 ridge accumulator and the linear projector
// kernel (on blocks, or sequence → sequence in native memory), plus whole-cache read/write of a
// NativeSequence as f32 blocks. Arguments are checked here before FFI; no fitting policy or
// artifact handling (fit.ts, artifact.ts).

import type { ModelConfig } from "../model/mod.ts";
import {
  encodeModelParams,
  EngineError,
  type NativeLibrary,
  NativeSequence,
  openNativeLibrary,
} from "../native/mod.ts";

/** One model's K or V for a token range: (layers, kv_heads, tokens, head_dim) f32, keys post-RoPE. */
export interface CacheBlock {
  k: Float32Array;
  v: Float32Array;
  tokens: number;
}

/** Features per token of a model's K (or V): layers × kv_heads × head_dim. */
export function featureWidth(config: ModelConfig): number {
  return config.numLayers * config.numKvHeads * config.headDim;
}

function cstr(ptr: Deno.PointerValue): string {
  return ptr === null ? "" : Deno.UnsafePointerView.getCString(ptr);
}

function checkCount(name: string, value: number, min: number, max = 0xffffffff): void {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new RangeError(`${name} must be an integer in [${min}, ${max}], got ${value}`);
  }
}

function checkF32(name: string, a: unknown, length: number): Float32Array {
  if (!(a instanceof Float32Array)) {
    throw new TypeError(`${name} must be a Float32Array, got ${Object.prototype.toString.call(a)}`);
  }
  if (a.length !== length) {
    throw new RangeError(`${name} has ${a.length} elements, expected ${length}`);
  }
  return a;
}

/** What differs between two configs in KV geometry or RoPE ("" when nothing). */
function kvGeometryMismatch(got: ModelConfig, want: ModelConfig): string {
  for (const key of ["numLayers", "numKvHeads", "headDim", "ropeTheta"] as const) {
    if (got[key] !== want[key]) return `${key} is ${got[key]}, projector expects ${want[key]}`;
  }
  const a = JSON.stringify(got.ropeScaling), b = JSON.stringify(want.ropeScaling);
  return a === b ? "" : `ropeScaling is ${a}, projector expects ${b}`;
}

/** geometry struct (kvr_model_params) for a config; only the KV/RoPE fields matter here */
function geometry(config: ModelConfig): Uint8Array {
  return encodeModelParams(config, "f32", 0);
}

function transform(
  fn: "kvr_kv_to_features" | "kvr_kv_from_features",
  config: ModelConfig,
  startPos: number,
  tokens: number,
  k: Float32Array,
  v: Float32Array,
  lib: NativeLibrary,
): { k: Float32Array; v: Float32Array } {
  checkCount("startPos", startPos, 0);
  checkCount("tokens", tokens, 1);
  const n = featureWidth(config) * tokens;
  checkF32("k", k, n);
  checkF32("v", v, n);
  const ko = new Float32Array(n), vo = new Float32Array(n);
  const big = BigInt(n);
  const st = lib.symbols[fn](geometry(config), startPos, tokens, k, big, v, big, ko, big, vo, big);
  lib.check(st, fn);
  return { k: ko, v: vo };
}

/**
 * Cache block → feature block: keys lose RoPE (inverse rotate-half at positions startPos + t,
 * with this model's RoPE parameters), both become (tokens, layers·kv_heads·head_dim).
 * @param config the model whose cache the block came from
 * @param startPos position of the block's first token
 * @param tokens tokens in the block (>= 1)
 * @param k (layers, kv_heads, tokens, head_dim) keys post-RoPE
 * @param v same shape, values
 * @param lib library (default openNativeLibrary())
 * @returns feature blocks k (pre-RoPE keys) and v, each (tokens, width)
 * @throws TypeError/RangeError for bad shapes; EngineError from native
 */
export function kvToFeatures(
  config: ModelConfig,
  startPos: number,
  tokens: number,
  k: Float32Array,
  v: Float32Array,
  lib: NativeLibrary = openNativeLibrary(),
): { k: Float32Array; v: Float32Array } {
  return transform("kvr_kv_to_features", config, startPos, tokens, k, v, lib);
}

/**
 * Feature block → cache block: keys get RoPE at startPos + t; the inverse of kvToFeatures.
 * @param config the model whose cache the block is for
 * @param startPos position of the first token
 * @param tokens tokens (>= 1)
 * @param k (tokens, width) pre-RoPE keys
 * @param v (tokens, width) values
 * @param lib library
 * @returns cache blocks (layers, kv_heads, tokens, head_dim)
 * @throws TypeError/RangeError for bad shapes; EngineError from native
 */
export function kvFromFeatures(
  config: ModelConfig,
  startPos: number,
  tokens: number,
  k: Float32Array,
  v: Float32Array,
  lib: NativeLibrary = openNativeLibrary(),
): { k: Float32Array; v: Float32Array } {
  return transform("kvr_kv_from_features", config, startPos, tokens, k, v, lib);
}

/**
 * Reads every layer of a sequence's cache for [start, start+count) as one f32 cache block.
 * @param seq the sequence (start+count <= length)
 * @param start first token
 * @param count tokens (>= 1)
 * @returns the block
 * @throws RangeError for a bad range; EngineError from native
 */
export function readCacheBlock(seq: NativeSequence, start: number, count: number): CacheBlock {
  const c = seq.model.config;
  checkCount("count", count, 1);
  const per = c.numKvHeads * count * c.headDim;
  const k = new Float32Array(c.numLayers * per), v = new Float32Array(c.numLayers * per);
  for (let l = 0; l < c.numLayers; l++) {
    const r = seq.readKv(l, start, count, "f32");
    k.set(new Float32Array(r.k.buffer, r.k.byteOffset, per), l * per);
    v.set(new Float32Array(r.v.buffer, r.v.byteOffset, per), l * per);
  }
  return { k, v, tokens: count };
}

/**
 * Writes a cache block into every layer of a sequence at [start, start+tokens) and sets the
 * length to start+tokens (values converted to the cache's dtype).
 * @param seq the sequence (start <= length, start+tokens <= capacity)
 * @param start first token
 * @param block (layers, kv_heads, tokens, head_dim) f32 blocks for seq's model
 * @throws RangeError for shapes not matching the model; EngineError from native
 */
export function writeCacheBlock(seq: NativeSequence, start: number, block: CacheBlock): void {
  const c = seq.model.config;
  checkCount("tokens", block.tokens, 1);
  const per = c.numKvHeads * block.tokens * c.headDim;
  checkF32("block.k", block.k, c.numLayers * per);
  checkF32("block.v", block.v, c.numLayers * per);
  for (let l = 0; l < c.numLayers; l++) {
    const k = new Uint8Array(block.k.buffer, block.k.byteOffset + l * per * 4, per * 4);
    const v = new Uint8Array(block.v.buffer, block.v.byteOffset + l * per * 4, per * 4);
    seq.writeKv(l, start, block.tokens, k, v, "f32");
  }
  seq.setLength(start + block.tokens);
}

/** Result of RidgeAccumulator.solve: W (outCount, nSel) row-major and bias (outCount), float64. */
export interface RidgeSolution {
  w: Float64Array;
  bias: Float64Array;
}

/**
 * Streaming float64 sufficient statistics for ridge regression y ≈ W·x + b (native memory,
 * bounded by (nIn+1)·(nIn+1+nOut) doubles). Free it with free() or `using`.
 */
export class RidgeAccumulator {
  /** features per row */
  readonly nIn: number;
  /** outputs per row */
  readonly nOut: number;
  readonly #lib: NativeLibrary;
  #ptr: Deno.PointerObject | null;
  #busy = false;
  #freeRequested = false;

  /**
   * @param nIn features per row (1..65536)
   * @param nOut outputs per row (1..65536)
   * @param lib library
   * @throws RangeError for bad sizes; EngineError from native (e.g. too large)
   */
  constructor(nIn: number, nOut: number, lib: NativeLibrary = openNativeLibrary()) {
    checkCount("nIn", nIn, 1, 65536);
    checkCount("nOut", nOut, 1, 65536);
    this.nIn = nIn;
    this.nOut = nOut;
    this.#lib = lib;
    const out = new BigUint64Array(1);
    lib.check(lib.symbols.kvr_ridge_create(nIn, nOut, out), "kvr_ridge_create");
    this.#ptr = Deno.UnsafePointer.create(out[0]) as Deno.PointerObject;
  }

  #handle(op: string): Deno.PointerObject {
    if (this.#ptr === null || this.#freeRequested) {
      throw new Error(`RidgeAccumulator.${op}(): freed`);
    }
    if (this.#busy) throw new Error(`RidgeAccumulator.${op}(): an accumulate() is in flight`);
    return this.#ptr;
  }

  /** Rows accumulated so far. */
  get rows(): number {
    return Number(this.#lib.symbols.kvr_ridge_rows(this.#handle("rows")));
  }

  /**
   * Adds rows (on a worker thread; buffers stay referenced until it settles).
   * @param x (rows, nIn) f32
   * @param y (rows, nOut) f32
   * @param rows row count (>= 1)
   * @param threads worker threads (0 = all cores)
   * @throws TypeError/RangeError for bad shapes; EngineError for non-finite values
   */
  async accumulate(x: Float32Array, y: Float32Array, rows: number, threads = 0): Promise<void> {
    const ptr = this.#handle("accumulate");
    checkCount("rows", rows, 1);
    checkF32("x", x, rows * this.nIn);
    checkF32("y", y, rows * this.nOut);
    this.#busy = true;
    let st: number;
    try {
      st = await this.#lib.symbols.kvr_ridge_accumulate(
        ptr,
        x,
        BigInt(x.length),
        y,
        BigInt(y.length),
        rows,
        threads,
      );
    } finally {
      this.#busy = false;
    }
    const error = st !== 0 ? cstr(this.#lib.symbols.kvr_ridge_last_error(ptr)) : "";
    if (this.#freeRequested) this.free();
    if (st !== 0) throw new EngineError(st, error, "kvr_ridge_accumulate");
  }

  /**
   * Adds the fit rows of positions [0, count) of two sequences over the same token ids in native
   * memory (kvr_ridge_accumulate_seq, on a worker thread): keys into `k`, values into `v`, x =
   * the source's features, y = the target's (RoPE stripped) — the statistics of
   * kvToFeatures(readCacheBlock(...)) of both + accumulate(), without moving features through
   * JavaScript. On a CUDA target with both sequences on its device the statistics are
   * accumulated there (float64). All four handles are busy until it settles.
   * @param k keys accumulator (nIn = source layers·kvHeads·headDim, nOut = the target's)
   * @param v values accumulator, same shape, not k
   * @param src source model's sequence (length >= count)
   * @param dst target model's sequence (length >= count)
   * @param count tokens (>= 1)
   * @param threads host worker threads (0 = all cores)
   * @throws TypeError for non-NativeSequence arguments; RangeError for a bad count, shapes that
   *   do not fit, k === v or src === dst; Error when freed or busy; EngineError from native (e.g.
   *   a non-finite feature; neither accumulator changes then)
   */
  static async accumulateSequences(
    k: RidgeAccumulator,
    v: RidgeAccumulator,
    src: NativeSequence,
    dst: NativeSequence,
    count: number,
    threads = 0,
  ): Promise<void> {
    for (const [name, seq] of [["src", src], ["dst", dst]] as const) {
      if (!(seq instanceof NativeSequence)) {
        throw new TypeError(`accumulateSequences(): ${name} must be a NativeSequence`);
      }
    }
    if (k === v) throw new RangeError("accumulateSequences(): k and v are the same accumulator");
    if (src === dst) {
      throw new RangeError("accumulateSequences(): src and dst are the same sequence");
    }
    const sc = src.model.config, tc = dst.model.config;
    const nIn = featureWidth(sc), nOut = featureWidth(tc);
    for (const [name, acc] of [["k", k], ["v", v]] as const) {
      if (acc.nIn !== nIn || acc.nOut !== nOut) {
        throw new RangeError(
          `accumulateSequences(): ${name} is ${acc.nIn}→${acc.nOut}, the sequences need ${nIn}→${nOut}`,
        );
      }
    }
    checkCount("count", count, 1);
    checkCount("threads", threads, 0, 4096);
    if (src.length < count || dst.length < count) {
      throw new RangeError(
        `accumulateSequences(): count ${count} exceeds a length (source ${src.length}, target ${dst.length})`,
      );
    }
    const kp = k.#handle("accumulateSequences"), vp = v.#handle("accumulateSequences");
    const sym = k.#lib.symbols;
    k.#busy = v.#busy = true;
    let st: number;
    try {
      st = await src.runWithHandle(
        "accumulateSequences",
        (sp) =>
          dst.runWithHandle(
            "accumulateSequences",
            (dp) => sym.kvr_ridge_accumulate_seq(kp, vp, sp, dp, count, threads),
          ),
      );
    } finally {
      k.#busy = v.#busy = false;
    }
    const error = st !== 0 ? cstr(sym.kvr_ridge_last_error(kp)) : "";
    if (k.#freeRequested) k.free();
    if (v.#freeRequested) v.free();
    if (st !== 0) throw new EngineError(st, error, "kvr_ridge_accumulate_seq");
  }

  /**
   * Copies the statistics.
   * @returns g ((nIn+1)², bias index nIn), c ((nIn+1), nOut), yy (nOut) and rows
   */
  stats(): { g: Float64Array; c: Float64Array; yy: Float64Array; rows: number } {
    const ptr = this.#handle("stats");
    const n1 = this.nIn + 1;
    const g = new Float64Array(n1 * n1), c = new Float64Array(n1 * this.nOut);
    const yy = new Float64Array(this.nOut);
    const st = this.#lib.symbols.kvr_ridge_stats(
      ptr,
      g,
      BigInt(g.length),
      c,
      BigInt(c.length),
      yy,
      BigInt(yy.length),
    );
    this.#lib.check(st, "kvr_ridge_stats");
    return { g, c, yy, rows: this.rows };
  }

  #selection(features: ArrayLike<number>, outStart: number, outCount: number): Uint32Array {
    if (features.length < 1) throw new RangeError("features is empty");
    const sel = new Uint32Array(features.length);
    for (let i = 0; i < features.length; i++) {
      checkCount(`features[${i}]`, features[i], 0, this.nIn - 1);
      if (i > 0 && features[i] <= features[i - 1]) {
        throw new RangeError(
          `features must be strictly increasing: ${features[i - 1]}, ${features[i]}`,
        );
      }
      sel[i] = features[i];
    }
    checkCount("outStart", outStart, 0, this.nOut - 1);
    checkCount("outCount", outCount, 1, this.nOut - outStart);
    return sel;
  }

  /**
   * Ridge solve (Cholesky, float64) for outputs [outStart, outStart+outCount) on a feature subset,
   * intercept unpenalised; the penalty is lambda × mean feature variance.
   * @param features strictly increasing feature indices
   * @param outStart first output
   * @param outCount outputs
   * @param lambda relative ridge strength >= 0
   * @returns W (outCount, nSel) and bias (outCount)
   * @throws RangeError for bad selections; EngineError (INVALID_ARGUMENT) when the regularised
   *   covariance is not positive definite or fewer than 2 rows were accumulated
   */
  solve(
    features: ArrayLike<number>,
    outStart: number,
    outCount: number,
    lambda: number,
  ): RidgeSolution {
    const ptr = this.#handle("solve");
    const sel = this.#selection(features, outStart, outCount);
    if (!Number.isFinite(lambda) || lambda < 0) {
      throw new RangeError(`lambda must be finite and >= 0, got ${lambda}`);
    }
    const w = new Float64Array(outCount * sel.length), bias = new Float64Array(outCount);
    const st = this.#lib.symbols.kvr_ridge_solve(
      ptr,
      sel,
      sel.length,
      outStart,
      outCount,
      lambda,
      w,
      BigInt(w.length),
      bias,
      BigInt(bias.length),
    );
    this.#lib.check(st, "kvr_ridge_solve");
    return { w, bias };
  }

  /**
   * Squared error of a solution over the rows accumulated here (from statistics alone).
   * @param features the solution's feature indices
   * @param outStart first output
   * @param sol W (outCount, nSel) and bias (outCount)
   * @returns per-output sse and sst (sum of squares about the mean)
   * @throws RangeError for mismatched shapes; EngineError from native
   */
  sse(
    features: ArrayLike<number>,
    outStart: number,
    sol: RidgeSolution,
  ): { sse: Float64Array; sst: Float64Array } {
    const ptr = this.#handle("sse");
    const outCount = sol.bias.length;
    const sel = this.#selection(features, outStart, outCount);
    if (sol.w.length !== outCount * sel.length) {
      throw new RangeError(`w has ${sol.w.length} elements, expected ${outCount * sel.length}`);
    }
    const sse = new Float64Array(outCount), sst = new Float64Array(outCount);
    const n = BigInt(outCount);
    const st = this.#lib.symbols.kvr_ridge_sse(
      ptr,
      sel,
      sel.length,
      outStart,
      outCount,
      sol.w,
      BigInt(sol.w.length),
      sol.bias,
      n,
      sse,
      n,
      sst,
      n,
    );
    this.#lib.check(st, "kvr_ridge_sse");
    return { sse, sst };
  }

  /** Frees the native statistics (after an accumulate in flight settles). Idempotent. */
  free(): void {
    this.#freeRequested = true;
    if (this.#ptr !== null && !this.#busy) {
      this.#lib.symbols.kvr_ridge_free(this.#ptr);
      this.#ptr = null;
    }
  }

  /** Same as free(). */
  [Symbol.dispose](): void {
    this.free();
  }
}

/**
 * A native linear KV projector: source cache block → target cache block (RoPE stripped with
 * the source's parameters, mapped, re-applied with the target's).
 */
export class LinearKernel {
  readonly source: ModelConfig;
  readonly target: ModelConfig;
  readonly #lib: NativeLibrary;
  #ptr: Deno.PointerObject | null;
  /** applies in flight (they may overlap: the native weights are read-only) */
  #inFlight = 0;
  #freeRequested = false;

  /**
   * @param source source model config
   * @param target target model config
   * @param wk (nTgt, nSrc) f32 key map in feature space; bk (nTgt)
   * @param bk key bias
   * @param wv (nTgt, nSrc) value map; bv (nTgt)
   * @param bv value bias
   * @param lib library
   * @throws TypeError/RangeError for shapes; EngineError for non-finite weights
   */
  constructor(
    source: ModelConfig,
    target: ModelConfig,
    wk: Float32Array,
    bk: Float32Array,
    wv: Float32Array,
    bv: Float32Array,
    lib: NativeLibrary = openNativeLibrary(),
  ) {
    const ns = featureWidth(source), nt = featureWidth(target);
    checkF32("wk", wk, nt * ns);
    checkF32("wv", wv, nt * ns);
    checkF32("bk", bk, nt);
    checkF32("bv", bv, nt);
    this.source = source;
    this.target = target;
    this.#lib = lib;
    const out = new BigUint64Array(1);
    const st = lib.symbols.kvr_projector_create(
      geometry(source),
      geometry(target),
      wk,
      BigInt(wk.length),
      bk,
      BigInt(bk.length),
      wv,
      BigInt(wv.length),
      bv,
      BigInt(bv.length),
      out,
    );
    lib.check(st, "kvr_projector_create");
    this.#ptr = Deno.UnsafePointer.create(out[0]) as Deno.PointerObject;
  }

  /**
   * The key or value map as stored natively, unpacked to (nTgt, nSrc) row-major f32 — the
   * conversion a device backend uploads (kvr_projector_weights); equals the constructor's array.
   * @param which "k" or "v"
   * @returns (nTgt, nSrc) f32
   * @throws Error when freed; RangeError for another `which`
   */
  weights(which: "k" | "v"): Float32Array {
    if (this.#ptr === null || this.#freeRequested) throw new Error("LinearKernel.weights(): freed");
    if (which !== "k" && which !== "v") {
      throw new RangeError(`weights(): which must be "k" or "v", got ${JSON.stringify(which)}`);
    }
    const out = new Float32Array(featureWidth(this.target) * featureWidth(this.source));
    const st = this.#lib.symbols.kvr_projector_weights(
      this.#ptr,
      which === "k" ? 1 : 0,
      out,
      BigInt(out.length),
    );
    this.#lib.check(st, "kvr_projector_weights");
    return out;
  }

  /**
   * Projects a source cache block (worker thread).
   * @param startPos position of the first token (same in both models)
   * @param src source cache block
   * @param threads worker threads (0 = all)
   * @returns the target cache block, keys post-RoPE
   * @throws TypeError/RangeError for shapes; EngineError from native
   */
  async apply(startPos: number, src: CacheBlock, threads = 0): Promise<CacheBlock> {
    if (this.#ptr === null || this.#freeRequested) throw new Error("LinearKernel.apply(): freed");
    const ptr = this.#ptr;
    checkCount("startPos", startPos, 0);
    checkCount("tokens", src.tokens, 1);
    const ns = featureWidth(this.source) * src.tokens, nt = featureWidth(this.target) * src.tokens;
    checkF32("src.k", src.k, ns);
    checkF32("src.v", src.v, ns);
    const k = new Float32Array(nt), v = new Float32Array(nt);
    this.#inFlight++;
    let st: number;
    try {
      st = await this.#lib.symbols.kvr_projector_apply(
        ptr,
        startPos,
        src.tokens,
        src.k,
        BigInt(ns),
        src.v,
        BigInt(ns),
        k,
        BigInt(nt),
        v,
        BigInt(nt),
        threads,
      );
    } finally {
      this.#inFlight--;
    }
    const error = st !== 0 ? cstr(this.#lib.symbols.kvr_projector_last_error(ptr)) : "";
    this.#maybeRelease();
    if (st !== 0) throw new EngineError(st, error, "kvr_projector_apply");
    return { k, v, tokens: src.tokens };
  }

  /**
   * Projects positions [0, count) of a source sequence's cache straight into an empty target
   * sequence's cache and sets its length to count, in native memory on a worker thread (no
   * JS-side copies): the same bits as writeCacheBlock(dst, 0, await apply(0,
   * readCacheBlock(src, 0, count))). Both sequences are busy (any other call on them throws)
   * until the promise settles.
   * @param src sequence of the source model (length >= count)
   * @param dst empty sequence of the target model (capacity >= count)
   * @param count tokens to project (>= 1)
   * @param threads worker threads (0 = all cores)
   * @throws TypeError when a sequence is not a NativeSequence or its model's KV geometry / RoPE is
   *   not the projector's; RangeError for a bad count or thread count, a source shorter than
   *   count, a non-empty or too small target, or src === dst; Error when freed or a sequence is
   *   busy; EngineError from native (message from kvr_projector_last_error)
   */
  async applySeq(
    src: NativeSequence,
    dst: NativeSequence,
    count: number,
    threads = 0,
  ): Promise<void> {
    if (this.#ptr === null || this.#freeRequested) {
      throw new Error("LinearKernel.applySeq(): freed");
    }
    const ptr = this.#ptr;
    for (
      const [name, seq, want] of [["src", src, this.source], ["dst", dst, this.target]] as const
    ) {
      if (!(seq instanceof NativeSequence)) {
        throw new TypeError(
          `applySeq(): ${name} must be a NativeSequence, got ${
            Object.prototype.toString.call(seq)
          }`,
        );
      }
      const why = kvGeometryMismatch(seq.model.config, want);
      if (why) throw new TypeError(`applySeq(): ${name} sequence's model does not fit: ${why}`);
    }
    if (src === dst) throw new RangeError("applySeq(): src and dst are the same sequence");
    checkCount("count", count, 1);
    checkCount("threads", threads, 0, 4096);
    if (src.length < count) {
      throw new RangeError(`applySeq(): source sequence holds ${src.length} tokens, need ${count}`);
    }
    if (dst.length !== 0) {
      throw new RangeError(`applySeq(): target sequence must be empty, holds ${dst.length} tokens`);
    }
    if (dst.capacity < count) {
      throw new RangeError(`applySeq(): target capacity ${dst.capacity} < ${count} tokens`);
    }
    const sym = this.#lib.symbols;
    this.#inFlight++;
    let r: { st: number; error: string } | undefined;
    try {
      r = await src.runWithHandle(
        "projectInto",
        (sp) =>
          dst.runWithHandle("projectInto", async (dp) => {
            const st = await sym.kvr_projector_apply_seq(ptr, sp, dp, count, threads);
            // the target's own message: no other call can have replaced it (it is held busy)
            return { st, error: st !== 0 ? cstr(sym.kvr_seq_last_error(dp)) : "" };
          }),
      );
    } finally {
      this.#inFlight--;
      this.#maybeRelease();
    }
    if (r.st !== 0) throw new EngineError(r.st, r.error, "kvr_projector_apply_seq");
  }

  /** @internal the kvr_projector* (tests call the test library's entry points with it)
   *  @throws Error when freed */
  get pointer(): Deno.PointerObject {
    if (this.#ptr === null || this.#freeRequested) throw new Error("LinearKernel: freed");
    return this.#ptr;
  }

  #maybeRelease(): void {
    if (this.#freeRequested && this.#inFlight === 0 && this.#ptr !== null) {
      this.#lib.symbols.kvr_projector_free(this.#ptr);
      this.#ptr = null;
    }
  }

  /** Frees the native weights (after applies in flight settle). Idempotent. */
  free(): void {
    this.#freeRequested = true;
    this.#maybeRelease();
  }

  /** Same as free(). */
  [Symbol.dispose](): void {
    this.free();
  }
}
