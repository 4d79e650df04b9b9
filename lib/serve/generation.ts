// One served generation: admission (slot.ts: the tier's capacity and the request deadline),
// prefill that reuses the tier's own prefix cache or migrates a lower tier's cached prefix
// (escalation, gated) else prefills fully, then the engine's decode loop, with metrics and a
// sequence that is freed on every exit path (finish, error, client disconnect, timeout, shutdown).
// Generation.tokens() is the one place a request's decode loop runs.
import {
  decodeLoop,
  type GenerateChunk,
  type GenerateOptions,
  type GenerateResult,
  type StepLogprobs,
} from "../engine/mod.ts";
import { type MigrationRefusalReason, MigrationRefusedError } from "../migrate/mod.ts";
import { prefillWithCache, type PrefixCache, storeChunks, StoreError } from "../store/mod.ts";
import { Lane } from "./lane.ts";
import { poolFullError } from "./pool_reserve.ts";
import { domainError } from "./native_engine.ts";
import { InputError, UnavailableError } from "./errors.ts";
import type { RequestContext } from "./request.ts";
import { requireReady, type Runtime } from "./runtime.ts";
import { type AbortCause, admitSlot, signalCause, stoppedError } from "./slot.ts";
import { SchedulerClosedError } from "./scheduler.ts";
import { QueueFullError } from "./queue.ts";
import type { Tier } from "./tier.ts";

/** Where the prompt's KV came from. */
export interface CacheOutcome {
  /** none: full prefill; prefix: the tier's own prefix cache; migrated: a lower tier's cached
   *  prefix projected into this tier; fallback: a lower tier had it but migration was refused;
   *  snapshot: imported from a snapshot (decode). */
  source: "none" | "prefix" | "migrated" | "fallback" | "snapshot";
  /** The lower tier whose cache was found (migrated/fallback). */
  fromTier?: string;
  /** Why migration was refused (fallback). */
  reason?: string;
  /** The same as a stable code (fallback): a gate refusal's code, `prompt_too_short` (the cached
   *  prefix does not exceed the repair length) or `cache_entry_rejected`. */
  reasonCode?: MigrationRefusalReason | "cache_entry_rejected";
  /** Prompt tokens whose prefill was skipped. */
  reusedTokens: number;
  /** Migrated: the projector's fitted logit temperature, applied while decoding (1 = none). */
  logitTemperature?: number;
}

/**
 * Sampling options for decoding from a cache: a migrated cache's logit temperature T scales
 * logits by 1/T before sampling, which composes with the sampling temperature t as t·T (greedy
 * stays greedy: argmax is unchanged).
 * @param options request options
 * @param cache where the KV came from
 * @returns options with the effective temperature
 */
export function withCacheTemperature(
  options: Omit<GenerateOptions, "signal">,
  cache: CacheOutcome,
): Omit<GenerateOptions, "signal"> {
  const T = cache.logitTemperature ?? 1;
  if (T === 1 || !options.temperature) return options;
  return { ...options, temperature: options.temperature * T };
}

/** The result of a served generation. */
export interface ServedResult extends GenerateResult {
  /** Set when finishReason is "abort". */
  abortCause?: AbortCause;
  /** Seconds spent decoding after the first token. */
  decodeSeconds: number;
  /** Per generated token, when logprobs were asked for (collect() only). */
  logprobs?: StepLogprobs[];
}

/** What to generate. */
export interface GenerationRequest {
  tier: Tier;
  /** Prompt token ids (≥ 1). */
  promptIds: number[];
  /** Sampling, maxTokens, stops (the signal is set here). */
  options: Omit<GenerateOptions, "signal">;
  /** Client signal, arrival, tenant. */
  ctx: RequestContext;
  /** Look in lower tiers' prefix caches when this tier's own misses (default true). */
  escalate?: boolean;
}

/**
 * Refuses a generation whose prompt plus max_tokens would exceed the tier's max_context.
 * @param tier the tier
 * @param promptTokens prompt length in tokens
 * @param maxTokens tokens to generate
 * @param param the prompt's field, blamed when the prompt alone reaches max_context
 * @param maxTokensParam the field maxTokens came from, blamed otherwise
 * @throws {InputError} context_length_exceeded
 */
export function checkContext(
  tier: Tier,
  promptTokens: number,
  maxTokens: number,
  param = "prompt",
  maxTokensParam = "max_tokens",
): void {
  const limit = tier.config.max_context;
  if (promptTokens + maxTokens <= limit) return;
  throw new InputError(
    `prompt (${promptTokens} tokens) + ${maxTokensParam} (${maxTokens}) exceeds tier "${tier.name}"'s max_context ${limit}`,
    promptTokens >= limit ? param : maxTokensParam,
    "context_length_exceeded",
  );
}

async function ownCachedChunks(prefix: PrefixCache, keys: string[]): Promise<number> {
  let n = 0;
  for (const k of keys) {
    if (!(await prefix.store.has(k))) break;
    n++;
  }
  return n;
}

/** A generation admitted and prefilled; iterate {@link Generation.tokens} once, or close it. */
export class Generation {
  #lane: Lane | null;
  #release: (() => void) | null;
  #closed = false;
  readonly #rt: Runtime;
  readonly #signal: AbortSignal;
  readonly #client: AbortSignal | undefined;
  readonly #startMs: number;
  readonly #logits: Float32Array;

  /** @internal built by {@link startGeneration} */
  constructor(
    rt: Runtime,
    readonly tier: Tier,
    readonly promptIds: number[],
    readonly options: Omit<GenerateOptions, "signal">,
    readonly cache: CacheOutcome,
    lane: Lane,
    logits: Float32Array,
    release: () => void,
    signals: { all: AbortSignal; client?: AbortSignal },
    startMs: number,
  ) {
    this.#rt = rt;
    this.#lane = lane;
    this.#logits = logits;
    this.#release = release;
    this.#signal = signals.all;
    this.#client = signals.client;
    this.#startMs = startMs;
  }

  /**
   * More choices of the same prompt: each new generation's sequence starts with this one's
   * prompt KV (no second prefill; on a paged tier the prompt's blocks are shared, not copied),
   * its first token drawn from the same last logits. Call before decoding. The queue slot is
   * shared: it goes back when the last of them closes.
   * @param options per new generation, its options (own seed, own grammar matcher, ...), derived
   *   from {@link Generation.options} (a migrated cache's temperature already applied)
   * @param param the request field that asked for them, blamed when they can never fit
   * @returns the new generations, in order
   * @throws {InputError} when the pool could never hold the shared prompt and a block of each
   *   choice's own; {@link QueueFullError} when it lacks a free block per new choice now;
   *   EngineError from the fork
   */
  fork(options: Omit<GenerateOptions, "signal">[], param = "n"): Generation[] {
    if (this.#closed || !this.#lane) throw new Error("generation already consumed or closed");
    const lane = this.#lane;
    const batch = this.tier.batch;
    if (batch && options.length > 0) {
      // The prompt's blocks are shared; each new choice soon needs one block of its own (its copy
      // of the partial last block, or the block after a full one).
      const per = Math.ceil(this.promptIds.length / batch.pool.blockTokens);
      const all = options.length + 1;
      if (per + options.length > batch.pool.blocksTotal) {
        throw new InputError(
          `${all} choices of a ${this.promptIds.length}-token prompt need ${
            per + options.length
          } KV blocks; tier "${this.tier.name}"'s pool holds ${batch.pool.blocksTotal}`,
          param,
        );
      }
      if (options.length > batch.pool.blocksFree + batch.cache.evictable) {
        this.#rt.metrics.rejected.inc({ tier: this.tier.name });
        throw new QueueFullError(this.tier.name, 1);
      }
    }
    const parentRelease = this.#release!;
    let open = options.length + 1;
    const release = () => {
      if (--open === 0) parentRelease();
    };
    this.#release = release;
    const out: Generation[] = [];
    try {
      for (const o of options) {
        const forked = lane.fork(this.promptIds);
        this.#rt.metrics.activeSequences.add({ tier: this.tier.name }, 1);
        out.push(
          new Generation(
            this.#rt,
            this.tier,
            this.promptIds,
            { ...o, maxTokens: o.maxTokens ?? this.options.maxTokens },
            this.cache,
            forked,
            this.#logits.slice(),
            release,
            { all: this.#signal, client: this.#client },
            this.#startMs,
          ),
        );
      }
    } catch (e) {
      for (const g of out) g.close();
      for (let i = out.length; i < options.length; i++) release();
      throw e;
    }
    return out;
  }

  /**
   * Decodes, yielding text deltas; frees the sequence and the queue slot when done.
   * @yields one chunk per sampled token
   * @returns the result (finishReason "abort" with abortCause when stopped early)
   */
  async *tokens(): AsyncGenerator<GenerateChunk, ServedResult> {
    if (this.#closed || !this.#lane) throw new Error("generation already consumed or closed");
    const m = this.#rt.metrics;
    const labels = { tier: this.tier.name };
    let firstAt: number | undefined;
    try {
      const loop = decodeLoop(this.#lane.target, this.#logits, {
        tokenizer: this.tier.model.tokenizer,
        eosTokenIds: this.tier.model.eosTokenIds,
        contextIds: this.promptIds.slice(-8),
        penaltyIds: this.promptIds,
        promptTokens: this.promptIds.length,
        startMs: this.#startMs,
      }, { ...this.options, signal: this.#signal });
      while (true) {
        let step: Awaited<ReturnType<typeof loop.next>>;
        try {
          step = await loop.next();
        } catch (e) {
          // The first draw (on the prefill's logits) and rows sampled in JavaScript fail here.
          throw domainError(e);
        }
        if (step.done) {
          const r = step.value;
          const decodeSeconds = firstAt === undefined ? 0 : (performance.now() - firstAt) / 1000;
          m.tokens.inc(labels, r.tokenIds.length);
          if (r.tokenIds.length > 0) m.ttft.observe(labels, r.ttftMs / 1000);
          if (r.tokenIds.length > 1 && decodeSeconds > 0) {
            m.tokensPerSecond.observe(labels, (r.tokenIds.length - 1) / decodeSeconds);
          }
          if (r.finishReason === "abort") {
            const cause = signalCause(this.#client, this.#rt);
            m.aborted.inc({ ...labels, cause });
            return { ...r, abortCause: cause, decodeSeconds };
          }
          return { ...r, decodeSeconds };
        }
        firstAt ??= performance.now();
        yield step.value;
      }
    } finally {
      this.close();
    }
  }

  /**
   * Runs the whole generation.
   * @returns the result
   * @throws {UnavailableError} timeout when the deadline passed, shutting_down on shutdown
   */
  async collect(): Promise<ServedResult> {
    const it = this.tokens();
    const logprobs: StepLogprobs[] = [];
    while (true) {
      const s = await it.next();
      if (s.done) {
        if (s.value.abortCause === "timeout" || s.value.abortCause === "shutdown") {
          throw abortError(s.value, this);
        }
        return logprobs.length > 0 ? { ...s.value, logprobs } : s.value;
      }
      if (s.value.logprobs) logprobs.push(s.value.logprobs);
    }
  }

  /** Frees the sequence and releases the queue slot (idempotent). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.options.grammar?.dispose(); // idempotent: the decode loop may have freed it already
    this.#lane?.free();
    this.#lane = null;
    this.#rt.metrics.activeSequences.add({ tier: this.tier.name }, -1);
    this.#release?.();
    this.#release = null;
  }
}

/**
 * The error a stream reports when its generation stopped early: 503 timeout_error past the
 * deadline, 503 unavailable_error on shutdown or when the client went away.
 * @param r the result (abortCause set)
 * @param gen the generation
 * @returns the error to send as the stream's last frame
 */
export function abortError(r: ServedResult, gen: Generation): UnavailableError {
  return r.abortCause === "timeout"
    ? new UnavailableError(
      "timeout",
      `request exceeded the tier's timeout of ${gen.tier.config.request_timeout_ms} ms`,
    )
    : r.abortCause === "shutdown"
    ? new UnavailableError("shutting_down", "server is shutting down")
    : new UnavailableError("client_gone", "client disconnected");
}

/**
 * Admits and prefills a generation (errors here come before any response byte).
 * @param rt the runtime
 * @param req tier, prompt ids, options, client signal
 * @returns the admitted generation (iterate or close it)
 * @throws {InputError} empty prompt or context too long; {@link UnavailableError} not ready,
 *   timeout, shutdown; {@link QueueFullError}
 */
export async function startGeneration(rt: Runtime, req: GenerationRequest): Promise<Generation> {
  const startMs = performance.now();
  const { tier, promptIds } = req;
  requireReady(rt);
  const maxTokens = req.options.maxTokens ?? tier.config.default_max_tokens;
  if (promptIds.length === 0) {
    throw new InputError("prompt is empty: it encodes to 0 tokens", "prompt");
  }
  checkContext(tier, promptIds.length, maxTokens);
  const slot = await admitSlot(rt, tier, req.ctx);
  const { release } = slot;
  rt.metrics.activeSequences.add({ tier: tier.name }, 1);
  let lane: Lane | null = null;
  try {
    lane = Lane.create(tier, promptIds.length + maxTokens, slot.signal, slot.started);
    const { logits, cache } = await prefill(
      rt,
      tier,
      lane,
      promptIds,
      req.escalate ?? true,
      req.ctx.tenant,
    );
    const options = withCacheTemperature({ ...req.options, maxTokens }, cache);
    return new Generation(rt, tier, promptIds, options, cache, lane, logits, release, {
      all: slot.signal,
      client: req.ctx.client,
    }, startMs);
  } catch (e) {
    lane?.free();
    rt.metrics.activeSequences.add({ tier: tier.name }, -1);
    release();
    // A deadline, disconnect or shutdown while the prompt waited in the scheduler.
    if (e instanceof SchedulerClosedError && slot.signal.aborted) {
      throw stoppedError(rt, tier, req.ctx.client, `prefilling on tier "${tier.name}"`);
    }
    throw e;
  }
}

async function prefill(
  rt: Runtime,
  tier: Tier,
  lane: Lane,
  ids: number[],
  escalate: boolean,
  tenant: string,
): Promise<{ logits: Float32Array; cache: CacheOutcome }> {
  const m = rt.metrics;
  const labels = { tier: tier.name };
  // Every cache this request touches is its tenant's view: no hit, reuse count or timing tells
  // it anything about another tenant's prompts.
  const prefix = tier.prefix?.forTenant(tenant);
  if (!prefix) {
    return { logits: await lane.prefill([], ids), cache: { source: "none", reusedTokens: 0 } };
  }
  try {
    const C = prefix.chunkTokens;
    const eligible = Math.floor((ids.length - 1) / C);
    let fallback: CacheOutcome | undefined;
    if (escalate && eligible > 0) {
      const own = await ownCachedChunks(prefix, await prefix.chunkKeys(ids, eligible));
      // The lower tier holding the longest cached prefix (more than this tier's own).
      let best: { tier: Tier; prefix: PrefixCache; chunks: number } | undefined;
      for (const lower of rt.tiers.values()) {
        if (lower.rank >= tier.rank || !lower.prefix || lower.prefix.chunkTokens !== C) continue;
        const lp = lower.prefix.forTenant(tenant);
        const n = await ownCachedChunks(lp, await lp.chunkKeys(ids, eligible));
        if (n > own && n > (best?.chunks ?? 0)) best = { tier: lower, prefix: lp, chunks: n };
      }
      if (best) {
        const migrated = await tryMigrate(rt, best, tier, lane, ids, best.chunks * C);
        if (migrated.ok) return { logits: migrated.logits, cache: migrated.cache };
        fallback = {
          source: "fallback",
          fromTier: best.tier.name,
          reason: migrated.reason,
          reasonCode: migrated.code,
          reusedTokens: 0,
        };
        m.fallbacks.inc({ from: best.tier.name, to: tier.name });
      }
    }
    // First tier: full blocks of this tenant's earlier prompts still in the pool, adopted with no
    // copy (a hit leaves at least the last token to prefill, for its logits).
    const batch = tier.batch;
    const bt = batch?.pool.blockTokens ?? 1;
    const blockKeys = batch
      ? await batch.cache.keys(await prefix.keySeed(), ids, Math.floor(ids.length / bt))
      : [];
    if (batch) {
      const lease = batch.cache.adopt(
        lane.seq,
        blockKeys.slice(0, Math.floor((ids.length - 1) / bt)),
      );
      lane.setLease(lease);
      const reused = lease.reusedTokens;
      if (reused > 0) {
        const logits = await lane.prefill(ids.slice(0, reused), ids.slice(reused));
        lane.setLease(batch.cache.insert(lane.seq, blockKeys, lease));
        m.prefixHits.inc(labels);
        m.reusedTokens.inc(labels, reused);
        m.prefixSharedBlocks.inc(labels, lease.entries.length);
        m.prefixCopiedBytes.inc(labels, 0);
        batch.refresh();
        // Second tier: the store keeps what another process could reuse.
        await storeChunks(prefix, lane.seq, ids, Math.floor(reused / C));
        return { logits, cache: fallback ?? { source: "prefix", reusedTokens: reused } };
      }
    }
    const r = await prefillWithCache(
      prefix,
      lane.seq,
      ids,
      (reused) => lane.prefill(ids.slice(0, reused), ids.slice(reused)),
    );
    if (batch) {
      lane.setLease(batch.cache.insert(lane.seq, blockKeys, { reusedTokens: 0, entries: [] }));
      batch.refresh();
    }
    if (r.reusedTokens > 0) {
      m.prefixHits.inc(labels);
      m.reusedTokens.inc(labels, r.reusedTokens);
      // Imported from the store: every reused token's KV was copied into the sequence.
      const tokenBytes = batch ? batch.pool.blockBytes / bt : 0;
      m.prefixCopiedBytes.inc(labels, r.reusedTokens * tokenBytes);
    } else if (eligible > 0) m.prefixMisses.inc(labels);
    if (fallback) return { logits: r.logits, cache: fallback };
    return {
      logits: r.logits,
      cache: r.reusedTokens > 0
        ? { source: "prefix", reusedTokens: r.reusedTokens }
        : { source: "none", reusedTokens: 0 },
    };
  } catch (e) {
    if (!(e instanceof StoreError)) throw e;
    // The cache is an optimisation: a store failure degrades to a full prefill.
    m.errors.inc({ type: "store_degraded" });
    lane.reset();
    return { logits: await lane.prefill([], ids), cache: { source: "none", reusedTokens: 0 } };
  }
}

type MigrateAttempt =
  | { ok: true; logits: Float32Array; cache: CacheOutcome }
  | { ok: false; code: NonNullable<CacheOutcome["reasonCode"]>; reason: string };

async function tryMigrate(
  rt: Runtime,
  lower: { tier: Tier; prefix: PrefixCache },
  to: Tier,
  lane: Lane,
  ids: number[],
  cachedTokens: number,
): Promise<MigrateAttempt> {
  const from = lower.tier;
  const gate = rt.migrator.gate(from, to);
  if (!gate.ok) return { ok: false, code: gate.code, reason: `${gate.code}: ${gate.reason}` };
  const keep = Math.max(0, cachedTokens - gate.repairTokens);
  if (keep === 0) {
    return {
      ok: false,
      code: "prompt_too_short",
      reason: "cached prefix is not longer than the repair length",
    };
  }
  const C = lower.prefix.chunkTokens;
  const src = from.model.native.createSequence(cachedTokens);
  try {
    const keys = await lower.prefix.chunkKeys(ids, cachedTokens / C);
    for (let i = 0; i < keys.length; i++) {
      const bytes = await lower.prefix.store.get(keys[i]);
      if (bytes === null || !(await lower.prefix.importChunk(src, bytes, ids, i))) {
        return {
          ok: false,
          code: "cache_entry_rejected",
          reason: `lower tier "${from.name}" cache entry ${i} vanished or was rejected`,
        };
      }
    }
    // Projected KV for [0, keep) into the lane's pool blocks (admitted first, as a prompt's
    // are), then repair: the target's scheduler prefills the rest with the other requests.
    const held = await lane.reserveBlocks(keep);
    try {
      await rt.migrator.projectInto(from, to, src, keep, lane.seq);
    } finally {
      held?.release();
    }
    const logits = await lane.prefill(ids.slice(0, keep), ids.slice(keep));
    rt.metrics.migrations.inc({ from: from.name, to: to.name });
    rt.metrics.reusedTokens.inc({ tier: to.name }, keep);
    return {
      ok: true,
      logits,
      cache: {
        source: "migrated",
        fromTier: from.name,
        reusedTokens: keep,
        logitTemperature: gate.temperature,
      },
    };
  } catch (e) {
    lane.reset();
    if (e instanceof MigrationRefusedError) {
      return { ok: false, code: e.reason, reason: e.message };
    }
    throw poolFullError(to, e);
  } finally {
    src.free();
  }
}
