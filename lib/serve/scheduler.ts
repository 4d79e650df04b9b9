// The continuous-batching scheduler of one loaded model: a step loop that gathers every attached
// sequence's pending work (a decode token, or a prompt to prefill in bounded chunks), asks the
// pure planStep (lib/serve/step_plan.ts) for the next step — decodes first, then prefill chunks
// first come first served within a token budget, admission by free KV blocks less those reserved
// for KV written outside the steps (snapshot imports, projections), which youngest sequences to
// preempt and recompute when a running one cannot grow — carries the plan out (preemptions, then
// one engine step or a burst of decode steps) and applies the engine's results, tagged
// (StepOutcome), to each request's state (SeqState) and its waiting promise.
// Sampling, stop conditions and streaming stay with each request (lib/engine decodeLoop drives a
// ScheduledSequence like a NativeSequence); an engine that samples natively takes each request's
// sampler into the step, so a decode returns a token id rather than a vocabulary of logits.
// Engine-agnostic: see StepEngine (S: its sequences, P: its samplers, O: their options); no HTTP.

import type { LogprobRequest, SampleResult } from "../native/mod.ts";
import { type PlanRow, type PlanSeq, planStep, type SeqState, type StepPlan } from "./step_plan.ts";

export type { SeqState } from "./step_plan.ts";

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
  /** makes at least `blocks` blocks free in the pool itself (blocksFree may count blocks that
   *  are only freeable, e.g. a prefix cache's idle ones): the reservations' KV is written
   *  outside the steps, so the blocks they hold must exist */
  makeFree?(blocks: number): void;
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

/** An item's result, tagged: what {@link Scheduler} hands a work when its last tokens stepped. */
export type StepOutcome =
  /** the last row's logits (a work that did not sample) */
  | { kind: "logits"; logits: Float32Array }
  /** the token the step sampled */
  | { kind: "token"; token: number }
  /** the tokens a burst sampled, each but the last in the cache now */
  | { kind: "tokens"; tokens: Int32Array }
  /** its own sampling failed (the step succeeded: its tokens are in the cache) */
  | { kind: "error"; error: unknown }
  /** nothing was asked of the row */
  | { kind: "none" };

/** Tags one result of {@link StepEngine.step}. */
function stepOutcome(r: StepResult): StepOutcome {
  if (r instanceof Float32Array) return { kind: "logits", logits: r };
  if (typeof r === "number") return { kind: "token", token: r };
  if (r instanceof Error) return { kind: "error", error: r };
  return { kind: "none" };
}

/** Tags one result of {@link StepEngine.decodeSteps}. */
function burstOutcome(r: Int32Array | Error): StepOutcome {
  return r instanceof Int32Array ? { kind: "tokens", tokens: r } : { kind: "error", error: r };
}

/** What a work's caller waits for, and how to hand it over. */
type Reply =
  | { want: "logits"; resolve: (logits: Float32Array) => void; reject: (e: unknown) => void }
  | { want: "token"; resolve: (r: SampleResult) => void; reject: (e: unknown) => void }
  | { want: "tokens"; resolve: (tokens: Int32Array) => void; reject: (e: unknown) => void };

/** Settles a reply with its work's outcome (a burst work stepped alone takes its one token). */
function settle(reply: Reply, out: StepOutcome): void {
  if (out.kind === "error") return reply.reject(out.error);
  switch (reply.want) {
    case "logits":
      if (out.kind === "logits") return reply.resolve(out.logits);
      break;
    case "token":
      if (out.kind === "token") return reply.resolve({ token: out.token });
      break;
    case "tokens":
      if (out.kind === "tokens") return reply.resolve(out.tokens);
      if (out.kind === "token") return reply.resolve(Int32Array.of(out.token));
      break;
  }
  reply.reject(new Error(`the step returned ${out.kind} where ${reply.want} was asked`));
}

interface Work<P> {
  tokens: number[];
  /** tokens of `tokens` already in the cache */
  fed: number;
  /** sample the next token in the step that completes the work (else: return the logits) */
  sample?: { sampler: P; width?: number };
  /** a decodeBurst work: it takes up to this many tokens past the first */
  burst?: number;
  reply: Reply;
}

interface Entry<S, P> {
  id: number;
  seq: S;
  state: SeqState;
  /** tokens in the cache (for recompute after a preemption) */
  history: number[];
  /** the pending prefill/decode (state waiting, prefilling, decoding or preempted) */
  work: Work<P> | null;
  /** what the last plan saw of it (rewritten in place each plan: no allocation per step) */
  view: PlanSeq;
  /** called once, when its first row is stepped (see {@link Scheduler.attach}) */
  onStart?: () => void;
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
          return sched.submitLogits(entry, [token]).then((logits) =>
            sampleRow.call(engine, sampler, logits, width, req)
          );
        }
        // The step's token resolves this promise directly (no async wrapper: one promise and one
        // microtask per token per request fewer — 32 of each per step at 32 requests).
        return sched.submitSample(entry, token, { sampler, width });
      };
      if (engine.decodeSteps && engine.truncate) {
        this.decodeBurst = (token, sampler, width, most) =>
          sched.submitBurst(entry, token, { sampler, width }, most);
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

  /** Where the sequence's request stands in the scheduler. */
  get state(): SeqState {
    return this.#entry.state;
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
    return this.#sched.submitLogits(this.#entry, Array.from(tokens));
  }

  /**
   * Appends one token (the next decode) and resolves with its logits.
   * @param token token id
   * @returns (vocab) logits
   * @throws as {@link prefill}
   */
  decode(token: number): Promise<Float32Array> {
    return this.#sched.submitLogits(this.#entry, [token]);
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
  /** most rows (sequences) one engine step carried */
  peakRows: number;
  /** rows over every step (a burst's rows count once per step): rows / steps is the batch */
  rows: number;
  /** wall time inside the engine's step calls, ms */
  engineMs: number;
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
    peakRows: 0,
    rows: 0,
    engineMs: 0,
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
   * @param onStart called once, when the sequence's first row is stepped (its request got
   *   capacity: admission stops counting it as waiting)
   * @returns the handle whose prefill/decode run in batched steps
   * @throws SchedulerClosedError after close()
   */
  attach(
    seq: S,
    history: ArrayLike<number> = [],
    onStart?: () => void,
  ): ScheduledSequence<S, P, O> {
    if (this.#closed) throw new SchedulerClosedError("scheduler is closed");
    const id = this.#nextId++;
    const entry: Entry<S, P> = {
      id,
      seq,
      state: "idle",
      history: Array.from(history),
      work: null,
      view: { id, state: "idle", left: 0, length: 0, held: 0, history: 0, samples: false },
      onStart,
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
      this.#engine.makeFree?.(this.#reserved);
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

  /** @internal ScheduledSequence.prefill/decode: resolves with the logits after `tokens` */
  submitLogits(entry: Entry<S, P>, tokens: number[]): Promise<Float32Array> {
    const bad = this.#refuse(entry, tokens.length);
    if (bad) return Promise.reject(bad);
    return new Promise<Float32Array>((resolve, reject) =>
      this.#enqueue(entry, tokens, undefined, undefined, { want: "logits", resolve, reject })
    );
  }

  /** @internal ScheduledSequence.decodeSample: resolves with the token sampled after `token` */
  submitSample(
    entry: Entry<S, P>,
    token: number,
    sample: { sampler: P; width?: number },
  ): Promise<SampleResult> {
    const bad = this.#refuse(entry, 1);
    if (bad) return Promise.reject(bad);
    return new Promise<SampleResult>((resolve, reject) =>
      this.#enqueue(entry, [token], sample, undefined, { want: "token", resolve, reject })
    );
  }

  /** @internal ScheduledSequence.decodeBurst: resolves with 1..most+1 sampled tokens */
  submitBurst(
    entry: Entry<S, P>,
    token: number,
    sample: { sampler: P; width?: number },
    most: number,
  ): Promise<Int32Array> {
    const bad = this.#refuse(entry, 1) ??
      (Number.isInteger(most) && most >= 0
        ? null
        : new RangeError(`most must be an integer >= 0, got ${most}`));
    if (bad) return Promise.reject(bad);
    return new Promise<Int32Array>((resolve, reject) =>
      this.#enqueue(entry, [token], sample, most, { want: "tokens", resolve, reject })
    );
  }

  /** Why a work of `tokens` tokens cannot be submitted for `entry` now; null when it can. */
  #refuse(entry: Entry<S, P>, tokens: number): Error | null {
    if (entry.state === "finished" || this.#closed) {
      return new SchedulerClosedError("sequence is detached from the scheduler");
    }
    if (tokens === 0) return new RangeError("no tokens to append");
    if (entry.work) {
      return new Error("a prefill/decode is still pending on this sequence; await it first");
    }
    const total = entry.history.length + tokens;
    if (Math.ceil(total / this.#engine.blockTokens) > this.#engine.blocksTotal) {
      return new RangeError(
        `a sequence of ${total} tokens needs more than the pool's ${this.#engine.blocksTotal} blocks of ${this.#engine.blockTokens}`,
      );
    }
    return null;
  }

  #enqueue(
    entry: Entry<S, P>,
    tokens: number[],
    sample: { sampler: P; width?: number } | undefined,
    burst: number | undefined,
    reply: Reply,
  ): void {
    entry.work = { tokens, fed: 0, sample, burst, reply };
    entry.state = this.#engine.length(entry.seq) === 0
      ? "waiting"
      : tokens.length === 1
      ? "decoding"
      : "prefilling";
    this.#expected.delete(entry);
    this.#kick();
  }

  /** @internal ScheduledSequence.detach */
  detach(entry: Entry<S, P>): void {
    if (entry.state === "finished") return;
    entry.state = "finished";
    this.#entries.delete(entry.id);
    this.#expected.delete(entry);
    const w = entry.work;
    entry.work = null;
    w?.reply.reject(new SchedulerClosedError("sequence detached"));
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
    if (n === 0 || entry.state === "finished") return;
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

  /** Every entry with a pending work, oldest first (Map order = admission order). */
  #pending(): Entry<S, P>[] {
    const out: Entry<S, P>[] = [];
    for (const e of this.#entries.values()) if (e.work) out.push(e);
    return out;
  }

  async #loop(): Promise<void> {
    try {
      while (!this.#closed) {
        const pending = this.#pending();
        if (pending.length === 0) {
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
          const entries = this.#pending();
          const plan = this.#plan(entries);
          this.#preemptAll(entries, plan.preempt);
          if (plan.tooLarge !== null) this.#failTooLarge(entries[plan.tooLarge]);
          if (plan.rows.length === 0) {
            // Nothing fits until some sequence leaves or shrinks (or a new work arrives).
            await this.#sleep(50);
            continue;
          }
          if (!(await this.#run(entries, plan.rows, plan.steps))) await this.#sleep(1);
          if (this.#blockWaiters.length > 0) this.#grantBlocks(); // sequences may have shrunk
        } catch (e) {
          // The engine itself failed (e.g. its pool was freed under us): nothing can run; every
          // waiting work gets the error rather than hanging. After close() this is expected.
          if (this.#closed) break;
          for (const entry of this.#pending()) this.#finishWork(entry, { kind: "error", error: e });
        }
      }
    } finally {
      this.#running = false;
      if (!this.#closed && this.#pending().length > 0) this.#kick();
    }
  }

  /**
   * The next step's plan for these pending entries (see {@link planStep}): reads the pool's counts
   * and each sequence's length and blocks, changes nothing.
   * @param pending every entry with a pending work, oldest first
   */
  #plan(pending: readonly Entry<S, P>[]): StepPlan {
    const eng = this.#engine;
    const seqs: PlanSeq[] = pending.map((e) => {
      const w = e.work!, v = e.view;
      v.state = e.state;
      v.left = w.tokens.length - w.fed;
      v.length = eng.length(e.seq);
      v.held = eng.blocksHeld(e.seq);
      v.history = e.history.length;
      v.burst = w.burst;
      v.samples = w.sample !== undefined;
      return v;
    });
    return planStep({
      seqs,
      free: eng.blocksFree() - this.#reserved,
      blockTokens: eng.blockTokens,
      blocksTotal: eng.blocksTotal,
      watermark: this.#watermark,
      maxBatch: this.#maxBatch,
      maxStepTokens: this.#maxStepTokens,
      burstSteps: this.#maxDecodeSteps >= 2 && eng.decodeSteps && eng.truncate
        ? Math.min(this.#maxDecodeSteps, Math.floor(this.#burstMs / this.#lastDecodeMs))
        : 1,
    });
  }

  /** Drops the KV of the plan's victims: each pending work then starts by recomputing every
   *  token its sequence held. */
  #preemptAll(entries: readonly Entry<S, P>[], victims: readonly number[]): void {
    for (const i of victims) {
      const victim = entries[i];
      this.#engine.reset(victim.seq);
      const w = victim.work!;
      w.tokens = [...victim.history, ...w.tokens.slice(w.fed)];
      w.fed = 0;
      victim.history = [];
      victim.state = "preempted";
      this.counters.preemptions++;
      this.#hooks.onPreempt?.();
    }
  }

  /** Fails the oldest work: its sequence could never fit in the pool. */
  #failTooLarge(head: Entry<S, P>): void {
    const w = head.work!;
    const total = this.#engine.length(head.seq) + w.tokens.length - w.fed;
    this.#finishWork(head, {
      kind: "error",
      error: new RangeError(
        `a sequence of ${total} tokens needs more than the pool's ${this.#engine.blocksTotal} blocks of ${this.#engine.blockTokens}`,
      ),
    });
  }

  /** Ends an entry's work with `out` (it is idle again: its request holds the sequence). */
  #finishWork(entry: Entry<S, P>, out: StepOutcome): void {
    const w = entry.work;
    if (!w) return;
    entry.work = null;
    entry.state = "idle";
    if (out.kind !== "error") this.#expected.add(entry);
    settle(w.reply, out);
  }

  /** Runs the plan's rows for `steps` steps (a burst when > 1) and applies the results; false
   *  when the engine found too few blocks (nothing changed: replan). */
  async #run(
    entries: readonly Entry<S, P>[],
    rows: readonly PlanRow[],
    steps: number,
  ): Promise<boolean> {
    const eng = this.#engine;
    const burst = steps > 1;
    const items: StepItem<S, P>[] = rows.map(({ seq, n }) => {
      const entry = entries[seq];
      if (entry.onStart) {
        const started = entry.onStart;
        entry.onStart = undefined;
        started();
      }
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
    const t0 = performance.now();
    let out: StepOutcome[];
    try {
      out = burst
        ? (await eng.decodeSteps!(items, steps)).map(burstOutcome)
        : (await eng.step(items)).map(stepOutcome);
    } catch (e) {
      if (eng.isPoolExhausted?.(e)) return false;
      for (const { seq } of rows) this.#finishWork(entries[seq], { kind: "error", error: e });
      return true;
    }
    const ms = performance.now() - t0;
    if (this.#closed) return true; // close() already rejected every work; the engine may be gone
    this.#apply(entries, rows, items, out, burst, ms);
    return true;
  }

  /**
   * Updates request state from a step's (or a burst's) tagged results: each row's tokens join its
   * history, a work whose last tokens stepped settles with its outcome and is idle, a partly
   * stepped one is prefilling; then the counters and the onStep hook.
   * @param entries the pending entries the plan was made for
   * @param rows the rows stepped (indexes into entries)
   * @param items what the engine got, per row
   * @param out per row its outcome (a burst's: "tokens" or "error")
   * @param burst whether the rows ran as a burst (engine decodeSteps)
   * @param ms wall time of the engine call
   */
  #apply(
    entries: readonly Entry<S, P>[],
    rows: readonly PlanRow[],
    items: readonly StepItem<S, P>[],
    out: readonly StepOutcome[],
    burst: boolean,
    ms: number,
  ): void {
    let steps = 1, decodes = 0, prefill = 0;
    if (rows.length > this.counters.peakRows) this.counters.peakRows = rows.length;
    this.counters.engineMs += ms;
    if (burst) {
      for (const r of out) {
        if (r.kind === "tokens" && r.tokens.length > steps) steps = r.tokens.length;
      }
    } else {
      for (const { seq, n } of rows) {
        if (n === 1 && entries[seq].history.length > 0) decodes++;
        else prefill += n;
      }
    }
    rows.forEach(({ seq, n }, i) => {
      const entry = entries[seq];
      const w = entry.work;
      if (!w) return; // detached meanwhile
      const r = out[i];
      const fed = items[i].tokens;
      if (fed.length === 1) entry.history.push(fed[0]);
      else entry.history.push(...fed);
      w.fed += n;
      if (w.fed < w.tokens.length) {
        entry.state = "prefilling";
        return;
      }
      if (r.kind === "tokens") {
        // Every token but the last went into the cache as the next step's input.
        for (let j = 0; j + 1 < r.tokens.length; j++) entry.history.push(r.tokens[j]);
        this.counters.decodeTokens += r.tokens.length - 1;
      }
      if (burst) this.counters.decodeTokens++;
      this.#finishWork(entry, r);
    });
    if (burst) {
      this.#lastDecodeMs = ms / steps;
      this.counters.steps += steps;
      this.counters.burstSteps += steps - 1;
      this.counters.rows += rows.length * steps;
      for (let s = 0; s < steps; s++) this.#reportStep(rows.length, rows.length, 0, ms / steps);
      return;
    }
    if (prefill === 0) this.#lastDecodeMs = ms;
    this.counters.steps++;
    this.counters.rows += rows.length;
    this.counters.decodeTokens += decodes;
    this.counters.prefillTokens += prefill;
    this.#reportStep(rows.length, decodes, prefill, ms);
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
