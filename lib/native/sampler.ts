// NativeSampler: a kvr_sampler — the production sampler (the same draws for the same logits and
// seed as the TypeScript oracle, tests/reference/sampler.ts), so a decode step can return a token
// id instead of a vocabulary of floats, with the request's logit processing (bias, penalties,
// min_tokens, mask) applied natively. Options are checked here before FFI. Not the option
// defaults or validation rules themselves (lib/engine/sampling.ts owns those).

import { checkInt } from "./check.ts";
import { EngineError, NoAllowedTokenError, NoFiniteLogitError } from "./errors.ts";
import { checkTokenMask, type TokenMask } from "../engine/sampling.ts";
import { cString, type NativeLibrary, openNativeLibrary } from "./library.ts";

/** sizeof(kvr_sampling_params). */
export const SAMPLING_PARAMS_BYTES = 40;
/** KVR_SAMPLER_MAX_TOP: most top-n logprobs per call. */
export const MAX_TOP_LOGPROBS = 64;

/** Resolved sampling settings (lib/engine validateSampling output plus a concrete seed). */
export interface NativeSamplingOptions {
  /** 0 = greedy */
  temperature: number;
  /** 0 = off */
  topK: number;
  /** 1 = off */
  topP: number;
  /** 0 = off */
  minP: number;
  /** safe integer */
  seed: number;
}

/** What to return besides the token. */
export interface LogprobRequest {
  /** the chosen token's log-probability (raw logits, temperature 1, no filters) */
  logprob?: boolean;
  /** this many most likely tokens with their log-probabilities (0..64) */
  topLogprobs?: number;
}

/** One sampled token with the logprobs that were asked for. */
export interface SampleResult {
  token: number;
  /** present when asked */
  logprob?: number;
  /** present when topLogprobs > 0: ids by descending logit and their log-probabilities */
  top?: { ids: Int32Array; logprobs: Float64Array };
}

/**
 * Encodes kvr_sampling_params (40 bytes, little-endian).
 *
 * @param o resolved options
 * @returns the struct bytes
 */
export function encodeSamplingParams(o: NativeSamplingOptions): Uint8Array {
  const b = new Uint8Array(SAMPLING_PARAMS_BYTES);
  const v = new DataView(b.buffer);
  v.setFloat64(0, o.temperature, true);
  v.setFloat64(8, o.topP, true);
  v.setFloat64(16, o.minP, true);
  v.setBigInt64(24, BigInt(o.seed), true);
  v.setUint32(32, Math.min(o.topK, 0xffff_ffff), true); // topK beyond any vocabulary = all
  v.setUint32(36, 0, true);
  return b;
}

/** @internal Output buffers of one sample call, reused across calls. */
export class SampleBuffers {
  readonly token = new Int32Array(1);
  readonly logprob = new Float64Array(1);
  readonly topCount = new Uint32Array(1);
  topIds = new Int32Array(0);
  topLogprobs = new Float64Array(0);

  /** Checks a request and sizes the top arrays. @throws RangeError for topLogprobs out of range */
  prepare(req: LogprobRequest): number {
    const top = checkInt("topLogprobs", req.topLogprobs ?? 0, 0, MAX_TOP_LOGPROBS);
    if (this.topIds.length < top) {
      this.topIds = new Int32Array(top);
      this.topLogprobs = new Float64Array(top);
    }
    return top;
  }

  /** The output arguments of a sample call (kvr_sampler_sample's last six), for `top` logprobs. */
  args(req: LogprobRequest, top: number) {
    return [
      this.token,
      req.logprob ? this.logprob : null,
      top > 0 ? this.topIds : null,
      top > 0 ? this.topLogprobs : null,
      top,
      this.topCount,
    ] as const;
  }

  /** The result after a successful call. */
  result(req: LogprobRequest, top: number): SampleResult {
    const r: SampleResult = { token: this.token[0] };
    if (req.logprob) r.logprob = this.logprob[0];
    if (top > 0) {
      const n = this.topCount[0];
      r.top = { ids: this.topIds.slice(0, n), logprobs: this.topLogprobs.slice(0, n) };
    }
    return r;
  }
}

/** A native sampler: settings plus its own PRNG stream. Free it (or `using`). */
export class NativeSampler {
  /** the options it was created with */
  readonly options: Readonly<NativeSamplingOptions>;
  readonly #lib: NativeLibrary;
  #ptr: Deno.PointerObject | null;
  readonly #out = new SampleBuffers();
  #busy = false;
  #maskTokens = 0;
  #keepsRows = false;

  private constructor(lib: NativeLibrary, ptr: Deno.PointerObject, o: NativeSamplingOptions) {
    this.#lib = lib;
    this.#ptr = ptr;
    this.options = { ...o };
  }

  /**
   * Creates a sampler.
   *
   * @param opts resolved options (validate with lib/engine validateSampling first)
   * @param lib library (default openNativeLibrary())
   * @returns the sampler
   * @throws EngineError when the library rejects an option (the message names it)
   */
  static create(
    opts: NativeSamplingOptions,
    lib: NativeLibrary = openNativeLibrary(),
  ): NativeSampler {
    const out = new BigUint64Array(1);
    lib.check(
      lib.symbols.kvr_sampler_create(encodeSamplingParams(opts), out),
      "kvr_sampler_create",
    );
    const ptr = Deno.UnsafePointer.create(out[0]);
    if (ptr === null) {
      throw new EngineError(-8, "kvr_sampler_create returned NULL", "kvr_sampler_create");
    }
    return new NativeSampler(lib, ptr, opts);
  }

  /** @internal the kvr_sampler*, checked not freed and not in use by a pending call */
  get pointer(): Deno.PointerObject {
    if (this.#ptr === null) throw new Error("NativeSampler: the sampler has been freed");
    if (this.#busy) {
      throw new Error("NativeSampler: a decodeSample() using this sampler is still running");
    }
    return this.#ptr;
  }

  /**
   * @internal Marks the sampler in use by a nonblocking call (NativeSequence.decodeSample) until
   * release(); sample(), free() and a second acquire() throw meanwhile.
   * @returns the kvr_sampler*
   */
  acquire(): Deno.PointerObject {
    const ptr = this.pointer;
    this.#busy = true;
    return ptr;
  }

  /** @internal ends acquire() */
  release(): void {
    this.#busy = false;
  }

  /** Whether a mask is set ({@link setMask}): its draws are then one decode step at a time. */
  get masked(): boolean {
    return this.#maskTokens !== 0;
  }

  /**
   * Sets (or, with null, clears) the allowed-token mask every later draw of this sampler uses
   * (kvr_sampler_set_mask: the words are copied). Disallowed tokens are never drawn.
   *
   * @param mask allowed tokens, or null for none
   * @throws RangeError/TypeError for a malformed mask (wrong length, bits past nTokens, no bit
   *   set), before FFI; Error while a call using the sampler runs
   */
  setMask(mask: TokenMask | null): void {
    const ptr = this.pointer;
    if (mask === null) {
      this.#lib.check(
        this.#lib.symbols.kvr_sampler_set_mask(ptr, null, 0n, 0),
        "kvr_sampler_set_mask",
      );
      this.#maskTokens = 0;
      return;
    }
    checkTokenMask(mask);
    const status = this.#lib.symbols.kvr_sampler_set_mask(
      ptr,
      mask.words,
      BigInt(mask.words.length),
      mask.nTokens,
    );
    if (status !== 0) {
      throw new EngineError(
        status,
        cString(this.#lib.symbols.kvr_sampler_last_error(ptr)),
        "kvr_sampler_set_mask",
      );
    }
    this.#maskTokens = mask.nTokens;
  }

  /**
   * Keeps (or stops keeping) the row of each later draw, so {@link redraw} can replace that draw
   * by one under a mask computed after it (kvr_sampler_keep_row): structured output then computes
   * a grammar's mask only when the grammar rejects the unmasked token. Exact for greedy samplers
   * and those without topK, topP or minP ({@link redrawIsExact}).
   *
   * @param keep whether to keep rows
   * @throws Error while a call using the sampler runs
   */
  keepRow(keep: boolean): void {
    this.#lib.check(
      this.#lib.symbols.kvr_sampler_keep_row(this.pointer, keep ? 1 : 0),
      "kvr_sampler_keep_row",
    );
    this.#keepsRows = keep;
  }

  /** Whether draws keep their rows ({@link keepRow}): a grammar takes each token before the next
   *  draw then, so its draws are one decode step at a time (as a masked sampler's). */
  get keepsRows(): boolean {
    return this.#keepsRows;
  }

  /**
   * Replaces the last draw with a draw from its kept row under the current mask (set it first):
   * the replaced token stops counting for the penalties and min_tokens (kvr_sampler_redraw).
   *
   * @param req logprobs to return (of the raw row, as {@link sample})
   * @returns the new draw
   * @throws EngineError without a kept row (keepRow off at that draw, or redrawn already);
   *   NoAllowedTokenError when no allowed token has a finite logit
   */
  redraw(req: LogprobRequest = {}): SampleResult {
    const ptr = this.pointer;
    const top = this.#out.prepare(req);
    const status = this.#lib.symbols.kvr_sampler_redraw(ptr, ...this.#out.args(req, top));
    // The kept row had a finite logit: its first draw succeeded.
    return this.#outcome(status, "kvr_sampler_redraw", req, top, true);
  }

  /** A draw's result, or its error: the row had no finite logit, the mask allowed none of
   *  those it had, or the library's own. */
  #outcome(
    status: number,
    fn: string,
    req: LogprobRequest,
    top: number,
    rowHasFinite: boolean,
  ): SampleResult {
    if (status === 0) return this.#out.result(req, top);
    const message = cString(this.#lib.symbols.kvr_sampler_last_error(this.pointer)) ||
      this.#lib.lastError();
    if (!rowHasFinite) throw new NoFiniteLogitError(message, fn);
    if (this.#maskTokens !== 0 && status === -1 && message.includes("the mask allows")) {
      throw new NoAllowedTokenError(message, fn);
    }
    throw new EngineError(status, message, fn);
  }

  /**
   * Sets the repetition penalty (transformers'/vLLM's): before each later draw the logits of the
   * tokens seen — `seenIds` (the prompt), then every token this sampler draws — are divided by
   * `penalty` when positive, multiplied by it otherwise; the logprobs see that row too. Call it
   * before the first draw.
   *
   * @param penalty finite > 0; 1 = off
   * @param seenIds token ids already in the context (≥ 0)
   * @throws EngineError when the library rejects a value (the message names it)
   */
  setRepetitionPenalty(penalty: number, seenIds: ArrayLike<number> = []): void {
    const ptr = this.pointer;
    const ids = Int32Array.from(seenIds);
    const status = this.#lib.symbols.kvr_sampler_set_repetition_penalty(
      ptr,
      penalty,
      ids.length > 0 ? ids : null,
      BigInt(ids.length),
    );
    if (status !== 0) {
      const message = cString(this.#lib.symbols.kvr_sampler_last_error(ptr)) ||
        this.#lib.lastError();
      throw new EngineError(status, message, "kvr_sampler_set_repetition_penalty");
    }
  }

  /**
   * Sets the logit bias (OpenAI's logit_bias): before each later draw `bias.get(id)` is added to
   * token id's logit (after the min_tokens ban, before the penalties and temperature). Call it
   * before the first draw.
   *
   * @param bias token id (>= 0) → finite value added; empty = none
   * @throws EngineError when the library rejects a value (the message names it)
   */
  setLogitBias(bias: ReadonlyMap<number, number>): void {
    const ids = Int32Array.from(bias.keys());
    const values = Float64Array.from(bias.values());
    this.#set(
      "kvr_sampler_set_logit_bias",
      (p) =>
        this.#lib.symbols.kvr_sampler_set_logit_bias(
          p,
          ids.length > 0 ? ids : null,
          values.length > 0 ? values : null,
          BigInt(ids.length),
        ),
    );
  }

  /**
   * Sets OpenAI's presence and frequency penalties over the tokens this sampler draws: before each
   * later draw, a token drawn n > 0 times has n·frequency + presence subtracted from its logit.
   *
   * @param presence finite; 0 = off
   * @param frequency finite; 0 = off
   * @throws EngineError when the library rejects a value (the message names it)
   */
  setPresenceFrequency(presence: number, frequency: number): void {
    this.#set(
      "kvr_sampler_set_presence_frequency",
      (p) => this.#lib.symbols.kvr_sampler_set_presence_frequency(p, presence, frequency),
    );
  }

  /**
   * Bans `stopIds` (logit -Infinity) from the draws until this sampler has drawn `minTokens`
   * tokens (vLLM's min_tokens). Call it before the first draw.
   *
   * @param minTokens draws the ban lasts (0 = off)
   * @param stopIds the ids banned (>= 0)
   * @throws EngineError when the library rejects a value (the message names it)
   */
  setMinTokens(minTokens: number, stopIds: ArrayLike<number>): void {
    const ids = Int32Array.from(stopIds);
    this.#set(
      "kvr_sampler_set_min_tokens",
      (p) =>
        this.#lib.symbols.kvr_sampler_set_min_tokens(
          p,
          checkInt("minTokens", minTokens, 0, 0xffff_ffff),
          ids.length > 0 ? ids : null,
          BigInt(ids.length),
        ),
    );
  }

  // Runs a setter on the sampler, turning a failed status into an EngineError with its message.
  #set(call: string, fn: (ptr: Deno.PointerObject) => number): void {
    const ptr = this.pointer;
    const status = fn(ptr);
    if (status !== 0) {
      const message = cString(this.#lib.symbols.kvr_sampler_last_error(ptr)) ||
        this.#lib.lastError();
      throw new EngineError(status, message, call);
    }
  }

  /**
   * Picks a token from logits[0..width).
   *
   * @param logits one row
   * @param width ids < width are candidates (default the row length)
   * @param req logprobs to return
   * @returns the token and the requested logprobs
   * @throws RangeError for a bad width or topLogprobs, or a mask longer than the row;
   *   NoFiniteLogitError when no logit is finite; NoAllowedTokenError when logits are finite but
   *   none the mask allows is
   */
  sample(logits: Float32Array, width = logits.length, req: LogprobRequest = {}): SampleResult {
    const ptr = this.pointer;
    checkInt("width", width, 1, logits.length);
    const top = this.#out.prepare(req);
    if (this.#maskTokens > logits.length) {
      throw new RangeError(
        `the sampler's mask covers ${this.#maskTokens} tokens, the row has ${logits.length}`,
      );
    }
    const status = this.#lib.symbols.kvr_sampler_sample(
      ptr,
      logits,
      BigInt(logits.length),
      width,
      ...this.#out.args(req, top),
    );
    return this.#outcome(
      status,
      "kvr_sampler_sample",
      req,
      top,
      status === 0 || hasFinite(logits, width),
    );
  }

  /**
   * Frees the native sampler (idempotent).
   * @throws Error while a decodeSample() using it is running
   */
  free(): void {
    if (this.#busy) throw new Error("NativeSampler.free(): a decodeSample() is still running");
    if (this.#ptr !== null) this.#lib.symbols.kvr_sampler_free(this.#ptr);
    this.#ptr = null;
  }

  [Symbol.dispose](): void {
    this.free();
  }
}

// Whether logits[0..width) holds a finite value (checked only after a failed draw).
function hasFinite(logits: Float32Array, width: number): boolean {
  for (let i = 0; i < width; i++) if (Number.isFinite(logits[i])) return true;
  return false;
}
