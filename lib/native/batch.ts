// The batched step (kvr_batch_step): one native call advancing several sequences of one model,
// each by its own tokens (a decode or a prefill chunk), logits only where wanted, or the next
// token sampled natively (kvr_batch_step_sample: no vocabulary row reaches JavaScript). Checks
// every argument before FFI, holds every sequence and sampler busy until the call settles (a
// free() meanwhile is deferred), and maps failures to EngineError. Not the scheduler (lib/serve).

import { checkInt, quoteValue } from "./check.ts";
import { EngineError, NoAllowedTokenError, NoFiniteLogitError } from "./errors.ts";
import type { NativeLibrary } from "./library.ts";
import { cString } from "./library.ts";
import type { NativeModel } from "./model.ts";
import type { NativeSampler } from "./sampler.ts";
import type { NativeSequence } from "./sequence.ts";
import { eventLoopTurn, nonblockingDone, syncStep, turnDue } from "./sync_step.ts";

/** One sequence's part of a batched step. */
export interface BatchItem {
  /** a sequence of the model (contiguous or paged), not freed, no call in flight */
  seq: NativeSequence;
  /** token ids appended at positions length.. (one for a decode, more for a prefill chunk) */
  tokens: ArrayLike<number>;
  /** return the logits of the last new position (else null for this item) */
  wantLogits: boolean;
  /** instead of logits: sample the next token from them natively (wantLogits must be false);
   *  from ids below width (default the vocabulary); the item's result is then the token id
   *  (or an EngineError for a row with no finite logit) */
  sample?: { sampler: NativeSampler; width?: number };
}

/** One item's result: its logits, its sampled token, null (neither asked), or the sampling
 *  failure of its row alone (the step itself succeeded: the tokens are in the cache). */
export type BatchResult = Float32Array | number | EngineError | null;

/** One sequence of a burst of decode steps ({@link runBatchDecodeSteps}). */
export interface DecodeStepsItem {
  /** a sequence of the model, not freed, no call in flight */
  seq: NativeSequence;
  /** the token appended by the first step */
  token: number;
  /** samples each step's next token (ids below width, default the vocabulary) */
  sample: { sampler: NativeSampler; width?: number };
}

/** One item's burst: the tokens it sampled, in order (at least one; every one but the last is
 *  in its cache after the call), or the sampling failure of its first step's row. */
export type DecodeStepsResult = Int32Array | EngineError;

/** Most sequences and tokens one step takes (the native bounds). */
export const MAX_BATCH_SEQS = 4096;
export const MAX_BATCH_TOKENS = 65536;

/*
 * A decode-only step (one token per item) of a model whose previous decode-only step took less than
 * `syncStep.maxBatchStepMs` (sync_step.ts, 4 ms) runs on the calling (JavaScript) thread instead of
 * Deno's blocking pool. Why: a nonblocking FFI call hands the step to a pool thread and the result
 * back to the event loop, and each step lands on whichever pool thread is free (cold caches as the
 * step's thread 0); for short steps that cost ~0.3 ms of a 1.3 ms 32-row tiny-fast step (1.0–1.2
 * vs 1.3–1.6 ms per step through the scheduler). The bound keeps the event loop
 * blocked no longer than a few milliseconds; prefill chunks and slower models' steps stay
 * off-thread. After `syncStep.budgetMs` (shared with the single-sequence steps) of back-to-back
 * synchronous steps, one yields an event-loop turn (setImmediate) before it resolves: a scheduler's
 * loop of synchronous steps resolved through microtasks alone would starve timers and I/O (HTTP
 * accepts, streamed tokens) until every decode finished, and a turn after every step cost 40–100 µs
 * of a ~1.2 ms step.
 */

/** The last decode-only step's duration per model (ms), for syncStep.maxBatchStepMs. */
const lastDecodeStepMs = new WeakMap<NativeModel, number>();

/** The per-item arrays one call passes to the library, kept for the next call: a typed array
 *  costs ~0.7 µs to create, and a step would make eight. A call takes a set off the free
 *  list and gives it back when the library is done with it, so calls in flight together (a
 *  nonblocking step) never share one. */
class StepArrays {
  counts = new Uint32Array(0);
  want = new Uint32Array(0);
  widths = new Uint32Array(0);
  ptrs = new BigUint64Array(0);
  samplerPtrs = new BigUint64Array(0);
  tokensOut = new Int32Array(0);
  ids = new Int32Array(0);

  /** Sizes the per-item arrays for n items; want/widths/samplerPtrs zeroed. */
  fit(n: number): void {
    if (this.counts.length < n) {
      const cap = Math.max(n, 2 * this.counts.length);
      this.counts = new Uint32Array(cap);
      this.want = new Uint32Array(cap);
      this.widths = new Uint32Array(cap);
      this.ptrs = new BigUint64Array(cap);
      this.samplerPtrs = new BigUint64Array(cap);
      this.tokensOut = new Int32Array(cap);
    } else {
      this.want.fill(0, 0, n);
      this.widths.fill(0, 0, n);
      this.samplerPtrs.fill(0n, 0, n);
    }
  }
}
const freeArrays: StepArrays[] = [];
/** The logits argument of a step that wants none (the library writes nothing to it). */
const NO_LOGITS = new Float32Array(1);

/**
 * @internal Runs one batched step (use NativeModel.batchStep).
 * @param lib the library
 * @param model the model every sequence belongs to
 * @param items the sequences and their tokens
 * @returns per item (see {@link BatchResult}): its (vocab) logits, its sampled token, or null
 * @throws TypeError/RangeError before FFI for bad items, duplicates, other models, bad ids,
 *   width or capacity, or both wantLogits and sample; EngineError (e.g. POOL_EXHAUSTED) when the
 *   native call fails — no length changes then; Error when a sequence or sampler is freed or busy
 */
export async function runBatchStep(
  lib: NativeLibrary,
  model: NativeModel,
  items: readonly BatchItem[],
): Promise<BatchResult[]> {
  checkCount(items);
  const arrays = freeArrays.pop() ?? new StepArrays();
  try {
    return await stepWith(lib, model, items, arrays, null) as BatchResult[];
  } finally {
    freeArrays.push(arrays);
  }
}

/**
 * @internal Runs up to `steps` decode steps of the same sequences back to back (use
 * NativeModel.batchDecodeSteps): step 1 appends each item's token and samples the next one
 * natively, every later step appends what the step before sampled. One JavaScript call for
 * several steps: between them only the sampled ids move to the next step's input, where a
 * scheduler round trip per step costs ~0.15 ms of a ~0.55 ms 32-row tiny-fast step.
 * The burst ends early (the steps done stand) when a step fails natively (e.g. the pool or a
 * sequence's capacity ran out) or a row has no finite logit; that row's sequence then gives back
 * the token the failed draw would have followed, so every sequence holds its returned tokens but
 * the last, as after single steps.
 * A burst with a masked sampler (structured output) runs one step: the row's next mask needs its
 * grammar to take this step's token first.
 * @param lib the library
 * @param model the model every sequence belongs to
 * @param items the sequences, their first tokens and samplers
 * @param steps most steps (>= 1)
 * @returns per item its sampled tokens, or the EngineError of its first step's draw
 * @throws as {@link runBatchStep} for the first step (nothing changes then)
 */
export async function runBatchDecodeSteps(
  lib: NativeLibrary,
  model: NativeModel,
  items: readonly DecodeStepsItem[],
  steps: number,
): Promise<DecodeStepsResult[]> {
  checkCount(items);
  checkInt("batchDecodeSteps(): steps", steps, 1, 1024);
  const batch: BatchItem[] = items.map((it, i) => {
    if (!it?.sample?.sampler) {
      throw new TypeError(`batchDecodeSteps(): items[${i}].sample.sampler is required`);
    }
    return { seq: it.seq, tokens: [it.token], wantLogits: false, sample: it.sample };
  });
  const arrays = freeArrays.pop() ?? new StepArrays();
  try {
    return await stepWith(lib, model, batch, arrays, steps) as DecodeStepsResult[];
  } finally {
    freeArrays.push(arrays);
  }
}

function checkCount(items: readonly unknown[]): void {
  if (!Array.isArray(items) || items.length === 0) {
    throw new RangeError(`batchStep(): items must be a non-empty array, got ${quoteValue(items)}`);
  }
  if (items.length > MAX_BATCH_SEQS) {
    throw new RangeError(`batchStep(): at most ${MAX_BATCH_SEQS} items, got ${items.length}`);
  }
}

/** runBatchStep (steps null) or runBatchDecodeSteps (every item one token and a sampler) with
 *  the call's arrays (sized here). */
async function stepWith(
  lib: NativeLibrary,
  model: NativeModel,
  items: readonly BatchItem[],
  arrays: StepArrays,
  steps: number | null,
): Promise<BatchResult[] | DecodeStepsResult[]> {
  const vocab = model.config.vocabSize;
  const n = items.length;
  arrays.fit(n);
  const { counts, want, widths } = arrays;
  let total = 0, wanted = 0, sampled = 0;
  const seen = new Set<NativeSequence>();
  const samplers = new Set<NativeSampler>();
  items.forEach((it, i) => {
    if (it?.seq?.model !== model) {
      throw new TypeError(`batchStep(): items[${i}].seq is not a sequence of this model`);
    }
    if (seen.has(it.seq)) throw new RangeError(`batchStep(): items[${i}].seq appears twice`);
    seen.add(it.seq);
    const len = it.tokens?.length;
    if (typeof len !== "number" || len < 1) {
      throw new RangeError(`batchStep(): items[${i}].tokens must hold at least one token id`);
    }
    counts[i] = len;
    want[i] = it.wantLogits ? 1 : 0;
    if (it.sample) {
      if (it.wantLogits) {
        throw new RangeError(`batchStep(): items[${i}] has both wantLogits and sample`);
      }
      const width = it.sample.width ?? vocab;
      // The message string only on failure (a template per item per step showed in profiles).
      widths[i] = Number.isInteger(width) && width >= 1 && width <= vocab
        ? width
        : checkInt(`batchStep(): items[${i}].sample.width`, width, 1, vocab);
      if (samplers.has(it.sample.sampler)) {
        throw new RangeError(`batchStep(): items[${i}].sample.sampler appears twice`);
      }
      samplers.add(it.sample.sampler);
      sampled++;
    }
    total += len;
    wanted += want[i];
  });
  if (total > MAX_BATCH_TOKENS) {
    throw new RangeError(`batchStep(): ${total} tokens exceed ${MAX_BATCH_TOKENS} per step`);
  }
  // Sized by the total just checked: the library reads `total` ids from this buffer.
  if (arrays.ids.length < total) {
    arrays.ids = new Int32Array(Math.max(total, 2 * arrays.ids.length));
  }
  const ids = arrays.ids;
  let off = 0;
  items.forEach((it, i) => {
    for (let j = 0; j < it.tokens.length; j++) {
      const t = it.tokens[j];
      ids[off++] = Number.isInteger(t) && t >= 0 && t < vocab
        ? t
        : checkInt(`batchStep(): items[${i}].tokens[${j}]`, t, 0, vocab - 1);
    }
    const length = it.seq.length, capacity = it.seq.capacity;
    if (length + it.tokens.length > capacity) {
      throw new RangeError(
        `batchStep(): items[${i}]: capacity exceeded: length ${length} + ${it.tokens.length} tokens > capacity ${capacity}`,
      );
    }
  });
  // Rows returned escape as views: a fresh buffer when any is wanted.
  const logits = wanted > 0 ? new Float32Array(wanted * vocab) : NO_LOGITS;
  const ptrs = arrays.ptrs;
  const samplerPtrs = sampled > 0 ? arrays.samplerPtrs : null;
  const tokensOut = arrays.tokensOut;
  const held: NativeSequence[] = [];
  const busy: NativeSampler[] = [];
  let status = 0;
  let message = "";
  let sync = false;
  /** a burst: each item's sampled tokens, step by step */
  let burst: number[][] | null = null;
  let done = 1;
  try {
    items.forEach((it, i) => {
      ptrs[i] = BigInt(Deno.UnsafePointer.value(it.seq.beginHold("batchStep")));
      held.push(it.seq);
      if (it.sample) {
        samplerPtrs![i] = BigInt(Deno.UnsafePointer.value(it.sample.sampler.acquire()));
        busy.push(it.sample.sampler);
      }
    });
    const decodeOnly = total === n;
    sync = decodeOnly && (lastDecodeStepMs.get(model) ?? Infinity) < syncStep.maxBatchStepMs;
    if (sync) syncStep.batchTaken++;
    const t0 = performance.now();
    const sym = lib.symbols;
    // One native step over the arrays as they stand (a burst's later steps refill `ids` first).
    const step = () =>
      samplerPtrs
        ? (sync ? sym.kvr_batch_step_sample_sync : sym.kvr_batch_step_sample)(
          ptrs,
          n,
          counts,
          ids,
          BigInt(total),
          want,
          logits,
          BigInt(wanted * vocab),
          samplerPtrs,
          widths,
          tokensOut,
        )
        : (sync ? sym.kvr_batch_step_sync : sym.kvr_batch_step)(
          ptrs,
          n,
          counts,
          ids,
          BigInt(total),
          want,
          logits,
          BigInt(wanted * vocab),
        );
    status = await step();
    // The message is on every sequence of the batch; read it before a deferred free runs.
    if (status !== 0) {
      message = cString(lib.symbols.kvr_seq_last_error(Deno.UnsafePointer.create(ptrs[0])));
    } else if (steps !== null) {
      // A burst (every item one token and a sampler): each step's draws are the next one's input.
      burst = items.map((_, i) => [tokensOut[i]]);
      // A grammar's row (masked, or keeping rows for a redraw) needs its grammar to take this
      // token (in JavaScript) before the next draw: a burst holding one stops after its first step.
      const masked = items.some((it) => it.sample!.sampler.masked || it.sample!.sampler.keepsRows);
      while (!masked && done < steps && burst.every((b) => b[b.length - 1] >= 0)) {
        for (let i = 0; i < n; i++) ids[i] = tokensOut[i];
        if (await step() !== 0) break; // nothing changed in that step: the ones done stand
        done++;
        for (let i = 0; i < n; i++) burst[i].push(tokensOut[i]);
      }
    }
    if (decodeOnly) {
      lastDecodeStepMs.set(model, (performance.now() - t0) / done);
    }
  } finally {
    for (const s of busy) s.release();
    for (const s of held) s.endHold();
  }
  if (!sync) nonblockingDone();
  else if (turnDue()) await eventLoopTurn(lib);
  if (status !== 0) throw new EngineError(status, message || lib.lastError(), "kvr_batch_step");
  if (burst) return burstResults(lib, items, burst, samplerPtrs!);
  const out: BatchResult[] = [];
  let row = 0;
  for (let i = 0; i < n; i++) {
    const sample = items[i].sample;
    if (want[i]) out.push(logits.subarray(row * vocab, ++row * vocab));
    else if (!sample) out.push(null);
    else if (tokensOut[i] >= 0) out.push(tokensOut[i]);
    else out.push(drawError(lib, sample.sampler, samplerPtrs![i]));
  }
  return out;
}

/** A burst's per-item results (runBatchDecodeSteps): a row whose draw failed at a later step ends
 *  at the token before; its sequence gives back that token, which the failed step appended. */
function burstResults(
  lib: NativeLibrary,
  items: readonly BatchItem[],
  burst: number[][],
  samplerPtrs: BigUint64Array,
): DecodeStepsResult[] {
  return burst.map((tokens, i) => {
    const failed = tokens.indexOf(-1);
    if (failed === 0) return drawError(lib, items[i].sample!.sampler, samplerPtrs[i]);
    if (failed > 0) {
      const seq = items[i].seq;
      seq.truncate(seq.length - 1);
      return Int32Array.from(tokens.slice(0, failed));
    }
    return Int32Array.from(tokens);
  });
}

/** The error of a row whose draw failed: no allowed token (a masked sampler) or no finite logit. */
function drawError(lib: NativeLibrary, sampler: NativeSampler, ptr: bigint): EngineError {
  const message = cString(lib.symbols.kvr_sampler_last_error(Deno.UnsafePointer.create(ptr)));
  return sampler.masked && message.includes("the mask allows")
    ? new NoAllowedTokenError(message, "kvr_batch_step_sample")
    : new NoFiniteLogitError(message, "kvr_batch_step_sample");
}
