// The continuous-batching scheduler of one loaded model: a step loop that gathers every attached
// sequence's pending work (a decode token, or a prompt to prefill in bounded chunks), packs one
// batched step (decodes first, then prefill chunks first come first served within a token
// budget), checks KV blocks before each step (admission by free blocks, less those reserved for
// KV written outside the steps — snapshot imports, projections; preempt-and-recompute of the
// youngest sequence when a running one cannot grow) and resolves each work with its logits.
// Sampling, stop conditions and streaming stay with each request (lib/engine decodeLoop drives a
// ScheduledSequence like a NativeSequence); an engine that samples natively takes each request's
// sampler into the step, so a decode returns a token id rather than a vocabulary of logits.
// Engine-agnostic: see StepEngine (S: its sequences, P: its samplers, O: their options); no HTTP.

import type { LogprobRequest, SampleResult } from "../native/mod.ts";

/** One sequence's part of a step, as the engine receives it. */
export interface StepItem<S, P = unknown> {
  seq: S;
  tokens: number[];
  wantLogits: boolean;
  /** sample the next token from the last row's logits (ids < width; undefined = all) instead
   *  of returning them (never together with wantLogits) */
  sample?: { sampler: P; width?: number };
}

/** One item's result: its logits, its sampled token, null (neither asked), or the failure of
 *  its own sampling (the step succeeded: the tokens are in the cache). */
export type StepResult = Float32Array | number | Error | null;

/** What the scheduler needs from a model with a paged KV pool (lib/serve/native_engine.ts). */
export interface StepEngine<S, P = unknown, O = unknown> {
  /** positions per KV block */
  readonly blockTokens: number;
  /** blocks in the pool */
  readonly blocksTotal: number;
  /** blocks free now */
  blocksFree(): number;
  /** blocks `seq` holds now */
  blocksHeld(seq: S): number;
  /** tokens in `seq` now */
  length(seq: S): number;
  /** drops every token of `seq`, giving its blocks back (preemption) */
  reset(seq: S): void;
  /** advances every item's sequence by its tokens; per item its {@link StepResult} */
  step(items: StepItem<S, P>[]): Promise<StepResult[]>;
  /** a sampler for one generation (engines that sample inside the step; with sampleRow) */
  createSampler?(opts: O): P;
  /** samples one logits row with a sampler of createSampler, logprobs as asked */
  sampleRow?(
    sampler: P,
    logits: Float32Array,
    width: number | undefined,
    req: LogprobRequest,
  ): SampleResult;
  /** whether an error from step() means "too few free blocks" (retry after replanning) */
  isPoolExhausted?(e: unknown): boolean;
  /** up to `steps` decode steps of the same items back to back (every item one token and a
   *  sampler; each later step appends what the one before sampled): per item the tokens it
   *  sampled (each but the last now in its cache) or its first draw's error; fewer steps when
   *  one fails. With truncate: the scheduler's bursts (SchedulerOptions.maxDecodeSteps). */
  decodeSteps?(items: StepItem<S, P>[], steps: number): Promise<(Int32Array | Error)[]>;
  /** shortens `seq` to `length` tokens (a burst's tokens past a stop go back) */
  truncate?(seq: S, length: number): void;
}

/** Limits of the step loop. */
export interface SchedulerOptions {
  /** most sequences in one step (default 64) */
  maxBatch?: number;
  /** most new tokens in one step, decodes included: bounds a prefill chunk (default 256) */
  maxStepTokens?: number;
  /** how long a step waits for sequences that just got their result to send their next token,
   *  in ms (default 2): sequences that take longer join the step after */
  gatherMs?: number;
  /** free blocks a NEW prefill must leave for running sequences to grow (default: 1/32 of the
   *  pool, at least 1) */
  watermarkBlocks?: number;
  /** most decode steps one burst runs (default 8; 1 = no bursts): when every waiting work is a
   *  decode that takes more tokens ({@link ScheduledSequence.decodeBurst}) and the engine has
   *  decodeSteps, the steps run back to back in one engine call, each request then consuming
   *  several tokens at once — the JavaScript between steps (resolving, streaming, planning) is
   *  then paid once per burst (vLLM's multi-step scheduling) */
  maxDecodeSteps?: number;
  /** a burst lasts about this long at most, by the last decode step's time, ms (default 4): it
   *  bounds how long a new request waits for the next plan and how bursty a stream gets */
  burstMs?: number;
}

/** What one step did (for metrics and traces). */
export interface StepStats {
  /** sequences in the step */
  seqs: number;
  /** decodes (1-token works of sequences holding KV) */
  decodes: number;
  /** prefill tokens (chunks of prompts or of recomputed histories) */
  prefillTokens: number;
  /** wall time of the engine step, ms */
  ms: number;
  blocksUsed: number;
  blocksFree: number;
}

/** Callbacks for metrics. */
export interface SchedulerHooks {
  onStep?(s: StepStats): void;
  onPreempt?(): void;
}

/** The scheduler was closed or the sequence detached while its work waited. */
export class SchedulerClosedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SchedulerClosedError";
  }
}

interface Work<P> {
  tokens: number[];
  /** tokens of `tokens` already in the cache */
  fed: number;
  /** sample the next token in the step that completes the work (else: return the logits) */
  sample?: { sampler: P; width?: number };
  /** resolve with a {@link SampleResult} `{ token }` rather than the bare token id */
  asSample: boolean;
  /** a decodeBurst work: it takes up to this many tokens past the first, and resolves with the
   *  sampled tokens (Int32Array) */
  burst?: number;
  resolve: (out: Float32Array | number | SampleResult | Int32Array) => void;
  reject: (e: unknown) => void;
}

interface Entry<S, P> {
  id: number;
  seq: S;
  /** tokens in the cache (for recompute after a preemption) */
  history: number[];
  work: Work<P> | null;
  detached: boolean;
}

/** A sequence attached to a scheduler: prefill/decode go through batched steps. */
export class ScheduledSequence<S, P = unknown, O = unknown> {
  readonly #sched: Scheduler<S, P, O>;
  readonly #entry: Entry<S, P>;
  /** A sampler for {@link decodeSample} (present when the engine samples natively). */
  readonly createSampler?: (opts: O) => P;
  /**
   * Appends one token and samples the next one inside the step (present when the engine
   * samples natively): the same token as sampling the logits {@link decode} returns. Asked for
   * logprobs, it takes the logits row of the step and samples it here instead.
   * @param token token id
   * @param sampler the generation's sampler (from createSampler)
   * @param width ids below width are candidates (default all)
   * @param req logprobs to return
   * @returns the sampled token (and the logprobs asked for)
   * @throws as {@link prefill}; the engine's error when the row has no finite logit
   */
  readonly decodeSample?: (
    token: number,
    sampler: P,
    width?: number,
    req?: LogprobRequest,
  ) => Promise<SampleResult>;

  /** @internal use Scheduler.attach */
  constructor(sched: Scheduler<S, P, O>, entry: Entry<S, P>, engine: StepEngine<S, P, O>) {
    this.#sched = sched;
    this.#entry = entry;
    const { createSampler, sampleRow } = engine;
    if (createSampler && sampleRow) {
      this.createSampler = (o) => createSampler.call(engine, o);
      this.decodeSample = (token, sampler, width, req) => {
        if (req && (req.logprob || (req.topLogprobs ?? 0) > 0)) {
          return (sched.submit(entry, [token]) as Promise<Float32Array>).then((logits) =>
            sampleRow.call(engine, sampler, logits, width, req)
          );
        }
        // The step's token resolves this promise directly (no async wrapper: one promise and one
        // microtask per token per request fewer — 32 of each per step at 32 requests).
        return sched.submit(entry, [token], { sampler, width }, true) as Promise<SampleResult>;
      };
      if (engine.decodeSteps && engine.truncate) {
        this.decodeBurst = (token, sampler, width, most) =>
          sched.submit(entry, [token], { sampler, width }, false, most) as Promise<Int32Array>;
      }
    }
  }

  /**
   * {@link decodeSample} that may take more tokens at once (present when the engine runs bursts:
   * decodeSteps and truncate): appends `token`, then resolves with 1..most+1 sampled tokens, each
   * but the last appended already — so the next call passes the last one. A request that stops
   * before using them all gives the extra ones back with {@link rewind}.
   * @param token token id
   * @param sampler the generation's sampler (from createSampler)
   * @param width ids below width are candidates (default all)
   * @param most most tokens past the first (0: exactly one)
   * @returns the sampled tokens, in order
   * @throws as {@link decodeSample}
   */
  readonly decodeBurst?: (
    token: number,
    sampler: P,
    width: number | undefined,
    most: number,
  ) => Promise<Int32Array>;

  /**
   * Drops the last `n` tokens of the sequence (a burst's tokens the request did not use). No
   * work may be pending.
   * @param n tokens to drop (<= those the sequence holds)
   * @throws RangeError for a bad n; Error when a work is pending
   */
  rewind(n: number): void {
    this.#sched.rewind(this.#entry, n);
  }

  /** The engine sequence. */
  get seq(): S {
    return this.#entry.seq;
  }

  /** Tokens the sequence holds as far as the scheduler knows (what a preemption recomputes). */
  get tokens(): number {
    return this.#entry.history.length;
  }

  /**
   * Appends tokens (a prompt; chunked over steps) and resolves with the logits after the last.
   * @param tokens token ids (at least one)
   * @returns (vocab) logits
   * @throws RangeError when empty; Error when another call is pending; SchedulerClosedError;
   *   the engine's error when its step fails
   */
  prefill(tokens: ArrayLike<number>): Promise<Float32Array> {
    return this.#sched.submit(this.#entry, Array.from(tokens)) as Promise<Float32Array>;
  }

  /**
   * Appends one token (the next decode) and resolves with its logits.
   * @param token token id
   * @returns (vocab) logits
   * @throws as {@link prefill}
   */
  decode(token: number): Promise<Float32Array> {
    return this.#sched.submit(this.#entry, [token]) as Promise<Float32Array>;
  }

  /** Leaves the scheduler: pending work is rejected; the caller frees the sequence. Idempotent. */
  detach(): void {
    this.#sched.detach(this.#entry);
  }
}

/** Blocks held back for a sequence that is filled outside the steps (a snapshot import, a
 *  projection) until it is attached: the steps plan as if they were taken already. While the
 *  sequence fills, the blocks it has taken count twice (held back and gone from the pool), so the
 *  steps are briefly more careful than needed, never over-committed. */
export interface BlockReservation {
  /** blocks held back */
  readonly blocks: number;
  /** Gives the blocks back to the steps (call once the sequence holds them, or failed). Idempotent. */
  release(): void;
}

interface BlockWaiter {
  blocks: number;
  resolve: (r: BlockReservation) => void;
  reject: (e: unknown) => void;
  signal?: AbortSignal;
  onAbort?: () => void;
}

/** Counters since creation. */
export interface SchedulerCounters {
  /** engine steps (a burst's steps each count) */
  steps: number;
  /** steps run as the second or later step of a burst */
  burstSteps: number;
  preemptions: number;
  decodeTokens: number;
  prefillTokens: number;
}

/** The step loop of one model (see the file comment). */
export class Scheduler<S, P = unknown, O = unknown> {
  readonly #engine: StepEngine<S, P, O>;
  readonly #maxBatch: number;
  readonly #maxStepTokens: number;
  readonly #gatherMs: number;
  readonly #watermark: number;
  readonly #maxDecodeSteps: number;
  readonly #burstMs: number;
  /** wall time of the last decode-only engine step, ms (per step of a burst) */
  #lastDecodeMs = Infinity;
  readonly #hooks: SchedulerHooks;
  readonly #entries = new Map<number, Entry<S, P>>();
  /** entries whose work resolved in the last step and that have not sent the next one yet */
  readonly #expected = new Set<Entry<S, P>>();
  #nextId = 0;
  /** blocks held back by live reservations (see {@link reserveBlocks}) */
  #reserved = 0;
  /** reservations waiting for free blocks, first come first served */
  readonly #blockWaiters: BlockWaiter[] = [];
  #wake: (() => void) | null = null;
  #running = false;
  /** the loop waits for the sequences of #expected (see #loop) */
  #gathering = false;
  #closed = false;
  readonly counters: SchedulerCounters = {
    steps: 0,
    burstSteps: 0,
    preemptions: 0,
    decodeTokens: 0,
    prefillTokens: 0,
  };

  /**
   * @param engine the model's batched step and KV pool
   * @param opts limits (see {@link SchedulerOptions})
   * @param hooks metrics callbacks
   * @throws RangeError for a limit that is not a positive integer
   */
  constructor(
    engine: StepEngine<S, P, O>,
    opts: SchedulerOptions = {},
    hooks: SchedulerHooks = {},
  ) {
    this.#engine = engine;
    this.#maxBatch = positive("maxBatch", opts.maxBatch ?? 64);
    this.#maxStepTokens = positive("maxStepTokens", opts.maxStepTokens ?? 256);
    this.#gatherMs = opts.gatherMs ?? 2;
    if (!(this.#gatherMs >= 0)) throw new RangeError(`gatherMs must be >= 0, got ${opts.gatherMs}`);
    this.#watermark = opts.watermarkBlocks ?? Math.max(1, Math.floor(engine.blocksTotal / 32));
    this.#maxDecodeSteps = positive("maxDecodeSteps", opts.maxDecodeSteps ?? 8);
    this.#burstMs = opts.burstMs ?? 4;
    if (!(this.#burstMs >= 0)) throw new RangeError(`burstMs must be >= 0, got ${opts.burstMs}`);
    this.#hooks = hooks;
  }

  /** Sequences attached now. */
  get attached(): number {
    return this.#entries.size;
  }

  /**
   * Attaches a sequence. `history` lists the tokens already in its cache (e.g. imported from a
   * prefix cache), which a preemption would recompute.
   * @param seq the engine sequence (the caller keeps ownership and frees it after detach)
   * @param history token ids already in the cache
   * @returns the handle whose prefill/decode run in batched steps
   * @throws SchedulerClosedError after close()
   */
  attach(seq: S, history: ArrayLike<number> = []): ScheduledSequence<S, P, O> {
    if (this.#closed) throw new SchedulerClosedError("scheduler is closed");
    const entry: Entry<S, P> = {
      id: this.#nextId++,
      seq,
      history: Array.from(history),
      work: null,
      detached: false,
    };
    this.#entries.set(entry.id, entry);
    return new ScheduledSequence(this, entry, this.#engine);
  }

  /**
   * Holds back `blocks` free KV blocks for a sequence filled outside the steps (a snapshot import
   * or a projection writes its KV straight into pool blocks), waiting first come first served
   * until they are free — the same wait a prompt has for its prefill. A new sequence leaves the
   * watermark free for running ones to grow, as a new prompt does (unless it needs more than the
   * pool holds beyond the watermark: then it waits for the blocks themselves). Release the
   * reservation once the sequence holds its blocks (or failed), before attaching it.
   * @param blocks blocks the sequence will take (0 resolves at once)
   * @param signal stops the wait (the promise rejects with SchedulerClosedError)
   * @returns the reservation
   * @throws RangeError when the pool could never hold `blocks`; SchedulerClosedError on close
   *   or abort
   */
  reserveBlocks(blocks: number, signal?: AbortSignal): Promise<BlockReservation> {
    if (!Number.isInteger(blocks) || blocks < 0) {
      return Promise.reject(new RangeError(`blocks must be an integer >= 0, got ${blocks}`));
    }
    if (blocks > this.#engine.blocksTotal) {
      return Promise.reject(
        new RangeError(
          `${blocks} KV blocks are more than the pool's ${this.#engine.blocksTotal}`,
        ),
      );
    }
    if (this.#closed) return Promise.reject(new SchedulerClosedError("scheduler is closed"));
    if (signal?.aborted) {
      return Promise.reject(new SchedulerClosedError("the request was stopped"));
    }
    return new Promise<BlockReservation>((resolve, reject) => {
      const w: BlockWaiter = { blocks, resolve, reject, signal };
      if (signal) {
        w.onAbort = () => {
          const i = this.#blockWaiters.indexOf(w);
          if (i < 0) return;
          this.#blockWaiters.splice(i, 1);
          reject(new SchedulerClosedError("the request was stopped"));
          this.#grantBlocks(); // the next waiter may fit now
        };
        signal.addEventListener("abort", w.onAbort, { once: true });
      }
      this.#blockWaiters.push(w);
      this.#grantBlocks();
    });
  }

  /** Blocks held back by reservations now. */
  get reservedBlocks(): number {
    return this.#reserved;
  }

  /**
   * Tells the scheduler that blocks went back to the pool outside its steps (a sequence was
   * freed or truncated), so a reservation waiting for them may go ahead.
   */
  blocksReleased(): void {
    this.#grantBlocks();
  }

  /** Grants waiting reservations, in order, while the head one fits. */
  #grantBlocks(): void {
    while (this.#blockWaiters.length > 0) {
      const w = this.#blockWaiters[0];
      const free = this.#engine.blocksFree() - this.#reserved;
      const keep = w.blocks + this.#watermark <= this.#engine.blocksTotal ? this.#watermark : 0;
      if (free - keep < w.blocks) return;
      this.#blockWaiters.shift();
      if (w.onAbort) w.signal!.removeEventListener("abort", w.onAbort);
      this.#reserved += w.blocks;
      let held = true;
      w.resolve({
        blocks: w.blocks,
        release: () => {
          if (!held) return;
          held = false;
          this.#reserved -= w.blocks;
          this.#grantBlocks();
          this.#kick();
        },
      });
    }
  }

  /** @internal ScheduledSequence.prefill/decode/decodeSample */
  submit(
    entry: Entry<S, P>,
    tokens: number[],
    sample?: { sampler: P; width?: number },
    asSample = false,
    burst?: number,
  ): Promise<Float32Array | number | SampleResult | Int32Array> {
    if (entry.detached || this.#closed) {
      return Promise.reject(new SchedulerClosedError("sequence is detached from the scheduler"));
    }
    if (tokens.length === 0) return Promise.reject(new RangeError("no tokens to append"));
    if (entry.work) {
      return Promise.reject(
        new Error("a prefill/decode is still pending on this sequence; await it first"),
      );
    }
    const total = entry.history.length + tokens.length;
    if (Math.ceil(total / this.#engine.blockTokens) > this.#engine.blocksTotal) {
      return Promise.reject(
        new RangeError(
          `a sequence of ${total} tokens needs more than the pool's ${this.#engine.blocksTotal} blocks of ${this.#engine.blockTokens}`,
        ),
      );
    }
    if (burst !== undefined && !(Number.isInteger(burst) && burst >= 0)) {
      return Promise.reject(new RangeError(`most must be an integer >= 0, got ${burst}`));
    }
    return new Promise<Float32Array | number | SampleResult | Int32Array>((resolve, reject) => {
      entry.work = { tokens, fed: 0, sample, asSample, burst, resolve, reject };
      this.#expected.delete(entry);
      this.#kick();
    });
  }

  /** @internal ScheduledSequence.detach */
  detach(entry: Entry<S, P>): void {
    if (entry.detached) return;
    entry.detached = true;
    this.#entries.delete(entry.id);
    this.#expected.delete(entry);
    const w = entry.work;
    entry.work = null;
    w?.reject(new SchedulerClosedError("sequence detached"));
    this.#kick();
  }

  /** @internal ScheduledSequence.rewind */
  rewind(entry: Entry<S, P>, n: number): void {
    if (!Number.isInteger(n) || n < 0 || n > entry.history.length) {
      throw new RangeError(
        `rewind(): n must be an integer in [0, ${entry.history.length}], got ${n}`,
      );
    }
    if (entry.work) throw new Error("rewind(): a prefill/decode is still pending on this sequence");
    if (n === 0 || entry.detached) return;
    entry.history.length -= n;
    this.#engine.truncate!(entry.seq, this.#engine.length(entry.seq) - n);
  }

  /** Rejects every pending work and refuses new ones. */
  close(): void {
    this.#closed = true;
    for (const w of this.#blockWaiters.splice(0)) {
      if (w.onAbort) w.signal!.removeEventListener("abort", w.onAbort);
      w.reject(new SchedulerClosedError("scheduler is closed"));
    }
    for (const e of [...this.#entries.values()]) this.detach(e);
  }

  #kick(): void {
    if (this.#gathering && this.#expected.size > 0 && !this.#closed) return; // see #loop
    const w = this.#wake;
    this.#wake = null;
    w?.();
    if (!this.#running && !this.#closed) {
      this.#running = true;
      queueMicrotask(() => this.#loop());
    }
  }

  #sleep(ms?: number): Promise<void> {
    return new Promise((resolve) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      this.#wake = () => {
        if (timer !== undefined) clearTimeout(timer);
        resolve();
      };
      if (ms !== undefined) {
        timer = setTimeout(() => {
          this.#wake = null;
          resolve();
        }, ms);
      }
    });
  }

  #pending(): Entry<S, P>[] {
    const out: Entry<S, P>[] = [];
    for (const e of this.#entries.values()) if (e.work) out.push(e); // Map order = admission order
    return out;
  }

  async #loop(): Promise<void> {
    try {
      while (!this.#closed) {
        if (this.#pending().length === 0) {
          if (this.#entries.size === 0) break;
          await this.#sleep();
          continue;
        }
        // Give sequences that just got their logits a moment to send their next token, so one
        // step carries them all (they sample synchronously; streaming may take a macrotask).
        // One timer per step: while gathering, only the last expected work wakes the loop (a
        // wake-up and a timer per arriving work cost ~0.1 ms of JavaScript per 32-row step).
        if (this.#expected.size > 0 && this.#gatherMs > 0) {
          this.#gathering = true;
          try {
            await this.#sleep(this.#gatherMs);
          } finally {
            this.#gathering = false;
          }
        }
        this.#expected.clear();
        try {
          const plan = this.#plan();
          if (plan.length === 0) {
            // Nothing fits until some sequence leaves or shrinks (or a new work arrives).
            await this.#sleep(50);
            continue;
          }
          if (!(await this.#step(plan))) await this.#sleep(1);
          if (this.#blockWaiters.length > 0) this.#grantBlocks(); // sequences may have shrunk
        } catch (e) {
          // The engine itself failed (e.g. its pool was freed under us): nothing can run; every
          // waiting work gets the error rather than hanging. After close() this is expected.
          if (this.#closed) break;
          for (const entry of this.#pending()) {
            const w = entry.work!;
            entry.work = null;
            w.reject(e);
          }
        }
      }
    } finally {
      this.#running = false;
      if (!this.#closed && this.#pending().length > 0) this.#kick();
    }
  }

  #blocksNeeded(e: Entry<S, P>, tokens: number, length = this.#engine.length(e.seq)): number {
    const bt = this.#engine.blockTokens;
    const want = Math.ceil((length + tokens) / bt);
    return Math.max(0, want - this.#engine.blocksHeld(e.seq));
  }

  /** Tokens `e` can append within `blocks` more blocks. */
  #tokensWithin(e: Entry<S, P>, blocks: number): number {
    const bt = this.#engine.blockTokens;
    return (this.#engine.blocksHeld(e.seq) + blocks) * bt - this.#engine.length(e.seq);
  }

  /** Drops the youngest block-holding sequence younger than `requester`, not in `keep` and
   *  waiting on the scheduler (a sequence between works may be in use by its request: export,
   *  streaming) — its pending work then starts by recomputing its tokens; null when none. */
  #preempt(keep: Set<Entry<S, P>>, requester: Entry<S, P>): Entry<S, P> | null {
    let victim: Entry<S, P> | null = null;
    for (const e of this.#entries.values()) {
      if (e.id <= requester.id || keep.has(e) || !e.work || this.#engine.blocksHeld(e.seq) === 0) {
        continue;
      }
      if (!victim || e.id > victim.id) victim = e;
    }
    if (!victim) return null;
    this.#engine.reset(victim.seq);
    // Its pending work now starts with everything the cache held.
    const w = victim.work!;
    w.tokens = [...victim.history, ...w.tokens.slice(w.fed)];
    w.fed = 0;
    victim.history = [];
    this.counters.preemptions++;
    this.#hooks.onPreempt?.();
    return victim;
  }

  #plan(): { entry: Entry<S, P>; n: number }[] {
    const plan: { entry: Entry<S, P>; n: number }[] = [];
    const inPlan = new Set<Entry<S, P>>();
    let committed = 0; // blocks the plan takes so far
    let budget = this.#maxStepTokens;
    const pending = this.#pending();
    // The pool's free count changes only by a preemption while planning: read once, then again
    // after each (a getter per use cost ~0.1 µs × several per sequence of a 32-row step).
    let poolFree = this.#engine.blocksFree() - this.#reserved;
    const free = () => poolFree - committed;
    // Decodes first, oldest first: a decode that cannot grow preempts the youngest younger
    // sequence; when there is none it waits for a later step.
    for (const e of pending) {
      const w = e.work!;
      if (plan.length >= this.#maxBatch || budget < 1) break;
      if (w.tokens.length - w.fed !== 1) continue;
      const len = this.#engine.length(e.seq);
      if (len === 0) continue;
      // A victim is younger than e, never e: its length and blocks stay as read.
      const need = this.#blocksNeeded(e, 1, len);
      while (need > free() && this.#preempt(inPlan, e)) {
        poolFree = this.#engine.blocksFree() - this.#reserved;
      }
      if (need > free()) continue;
      plan.push({ entry: e, n: 1 });
      inPlan.add(e);
      committed += need;
      budget--;
    }
    // Then prefill chunks (prompts, recomputes), first come first served: a work that cannot get
    // any block stops the scan, so later arrivals never overtake it. A NEW prompt leaves the
    // watermark free for running sequences to grow.
    for (const e of pending) {
      if (inPlan.has(e) || plan.length >= this.#maxBatch || budget < 1) continue;
      const w = e.work!;
      const left = w.tokens.length - w.fed;
      if (w.fed === 0 && w.tokens.length === 1 && this.#engine.length(e.seq) > 0) continue; // a waiting decode
      const fresh = this.#engine.length(e.seq) === 0 && w.fed === 0;
      const avail = Math.max(0, free() - (fresh ? this.#watermark : 0));
      const n = Math.min(left, budget, this.#tokensWithin(e, avail));
      if (n < 1) break;
      plan.push({ entry: e, n });
      inPlan.add(e);
      committed += this.#blocksNeeded(e, n);
      budget -= n;
    }
    if (plan.length === 0 && pending.length > 0) {
      // Blocked: free the youngest holder younger than the oldest waiting work, if any.
      const head = pending[0];
      if (this.#preempt(new Set(), head)) return this.#plan();
      const w = head.work!;
      const total = this.#engine.length(head.seq) + w.tokens.length - w.fed;
      if (Math.ceil(total / this.#engine.blockTokens) > this.#engine.blocksTotal) {
        head.work = null;
        w.reject(
          new RangeError(
            `a sequence of ${total} tokens needs more than the pool's ${this.#engine.blocksTotal} blocks of ${this.#engine.blockTokens}`,
          ),
        );
      }
    }
    return plan;
  }

  /** An engine call of the plan failed: false when the engine found too few blocks (blocks went
   *  elsewhere meanwhile: nothing changed, replan), else every work of the plan gets the error. */
  #failed(plan: { entry: Entry<S, P>; n: number }[], e: unknown): boolean {
    if (this.#engine.isPoolExhausted?.(e)) return false;
    for (const { entry } of plan) {
      const w = entry.work;
      entry.work = null;
      w?.reject(e);
    }
    return true;
  }

  /** Steps of a burst for this plan: more than one only when the engine runs bursts, every
   *  waiting work is in the plan as a decode that takes more tokens (a prompt or a logits decode
   *  waiting elsewhere gets the next plan at once instead), the last decode step times the burst
   *  within burstMs, and the pool holds every sequence's tokens without a preemption. */
  #burstSteps(plan: { entry: Entry<S, P>; n: number }[]): number {
    const eng = this.#engine;
    if (this.#maxDecodeSteps < 2 || !eng.decodeSteps || !eng.truncate) return 1;
    let k = Math.min(this.#maxDecodeSteps, Math.floor(this.#burstMs / this.#lastDecodeMs));
    if (!(k >= 2)) return 1;
    let waiting = 0;
    for (const e of this.#entries.values()) if (e.work) waiting++;
    if (waiting !== plan.length) return 1;
    for (const { entry, n } of plan) {
      const w = entry.work!;
      if (
        n !== 1 || w.burst === undefined || !w.sample || w.fed !== 0 || w.tokens.length !== 1 ||
        entry.history.length === 0
      ) return 1;
      k = Math.min(k, w.burst + 1);
    }
    if (k < 2) return 1;
    let need = 0;
    for (const { entry } of plan) need += this.#blocksNeeded(entry, k);
    return need <= eng.blocksFree() - this.#reserved ? k : 1;
  }

  /** Runs a burst of `k` decode steps of the plan's sequences in one engine call (see
   *  SchedulerOptions.maxDecodeSteps); false when the engine found too few blocks. */
  async #burst(plan: { entry: Entry<S, P>; n: number }[], k: number): Promise<boolean> {
    const items: StepItem<S, P>[] = plan.map(({ entry }) => ({
      seq: entry.seq,
      tokens: entry.work!.tokens,
      wantLogits: false,
      sample: entry.work!.sample,
    }));
    const t0 = performance.now();
    let out: (Int32Array | Error)[];
    try {
      out = await this.#engine.decodeSteps!(items, k);
    } catch (e) {
      return this.#failed(plan, e);
    }
    const ms = performance.now() - t0;
    if (this.#closed) return true;
    let steps = 1;
    for (const r of out) if (r instanceof Int32Array && r.length > steps) steps = r.length;
    this.#lastDecodeMs = ms / steps;
    this.counters.steps += steps;
    this.counters.burstSteps += steps - 1;
    plan.forEach(({ entry }, i) => {
      const w = entry.work;
      if (!w) return; // detached meanwhile
      const r = out[i];
      entry.history.push(w.tokens[0]);
      entry.work = null;
      this.counters.decodeTokens++;
      if (r instanceof Error) return w.reject(r); // its first draw failed; the others go on
      // Every token but the last went into the cache as the next step's input.
      for (let j = 0; j + 1 < r.length; j++) entry.history.push(r[j]);
      this.counters.decodeTokens += r.length - 1;
      this.#expected.add(entry);
      w.resolve(r);
    });
    for (let s = 0; s < steps; s++) this.#reportStep(plan.length, plan.length, 0, ms / steps);
    return true;
  }

  /** Runs one step (or a burst); false when the engine found too few blocks (nothing changed:
   *  replan). */
  async #step(plan: { entry: Entry<S, P>; n: number }[]): Promise<boolean> {
    const burst = this.#burstSteps(plan);
    if (burst > 1) return this.#burst(plan, burst);
    const items: StepItem<S, P>[] = plan.map(({ entry, n }) => {
      const w = entry.work!;
      const last = w.fed + n === w.tokens.length;
      const item: StepItem<S, P> = {
        seq: entry.seq,
        // a whole work (every decode) as it is: its tokens array is never changed in place
        tokens: w.fed === 0 && last ? w.tokens : w.tokens.slice(w.fed, w.fed + n),
        wantLogits: last && !w.sample,
      };
      if (last && w.sample) item.sample = w.sample;
      return item;
    });
    let decodes = 0, prefill = 0;
    plan.forEach(({ entry, n }) => {
      if (n === 1 && entry.history.length > 0) decodes++;
      else prefill += n;
    });
    const t0 = performance.now();
    let out: StepResult[];
    try {
      out = await this.#engine.step(items);
    } catch (e) {
      return this.#failed(plan, e);
    }
    const ms = performance.now() - t0;
    if (this.#closed) return true; // close() already rejected every work; the engine may be gone
    if (prefill === 0) this.#lastDecodeMs = ms;
    this.counters.steps++;
    this.counters.decodeTokens += decodes;
    this.counters.prefillTokens += prefill;
    plan.forEach(({ entry, n }, i) => {
      const w = entry.work;
      if (!w) return; // detached meanwhile
      const fed = items[i].tokens;
      if (fed.length === 1) entry.history.push(fed[0]);
      else entry.history.push(...fed);
      w.fed += n;
      if (w.fed < w.tokens.length) return;
      entry.work = null;
      const r = out[i];
      if (r instanceof Error) return w.reject(r); // its own sampling failed; the others go on
      this.#expected.add(entry);
      w.resolve(
        w.burst !== undefined
          ? Int32Array.of(r as number)
          : w.asSample
          ? { token: r as number }
          : r!,
      );
    });
    this.#reportStep(plan.length, decodes, prefill, ms);
    return true;
  }

  /** One engine step's {@link StepStats} to the onStep hook (with the pool's counts now). */
  #reportStep(seqs: number, decodes: number, prefillTokens: number, ms: number): void {
    if (!this.#hooks.onStep) return;
    const free = this.#engine.blocksFree();
    this.#hooks.onStep({
      seqs,
      decodes,
      prefillTokens,
      ms,
      blocksUsed: this.#engine.blocksTotal - free,
      blocksFree: free,
    });
  }
}

function positive(name: string, v: number): number {
  if (!Number.isInteger(v) || v < 1) {
    throw new RangeError(`${name} must be an integer >= 1, got ${v}`);
  }
  return v;
}
