// A small Prometheus registry (counters, gauges, histograms with labels) rendered in the text
// exposition format 0.0.4, plus the named metrics every kvrelay function exports. Not a client
// library: no push, no summaries, no exemplars.

type Labels = Record<string, string>;

function labelKey(labels: Labels): string {
  const keys = Object.keys(labels).sort();
  return keys.map((k) =>
    `${k}="${String(labels[k]).replace(/[\\"\n]/g, (c) => c === "\n" ? "\\n" : `\\${c}`)}"`
  )
    .join(",");
}

abstract class Metric {
  constructor(readonly name: string, readonly help: string, readonly type: string) {}
  abstract render(): string[];
}

/** One number per label set: what counters and gauges share. */
abstract class Series extends Metric {
  protected readonly values = new Map<string, number>();
  /** Current value of one series (0 when never set). */
  get(labels: Labels = {}): number {
    return this.values.get(labelKey(labels)) ?? 0;
  }
  protected addTo(labels: Labels, n: number): void {
    const k = labelKey(labels);
    this.values.set(k, (this.values.get(k) ?? 0) + n);
  }
  render(): string[] {
    return [...this.values].map(([k, v]) => `${this.name}${k ? `{${k}}` : ""} ${v}`);
  }
}

/** A monotonically increasing count per label set. */
export class Counter extends Series {
  constructor(name: string, help: string) {
    super(name, help, "counter");
  }
  /** Adds `n` (default 1) to the series of `labels`. */
  inc(labels: Labels = {}, n = 1): void {
    this.addTo(labels, n);
  }
}

/** A value that goes up and down per label set. */
export class Gauge extends Series {
  constructor(name: string, help: string) {
    super(name, help, "gauge");
  }
  /** Sets the series of `labels` to `v`. */
  set(labels: Labels, v: number): void {
    this.values.set(labelKey(labels), v);
  }
  /** Adds `n` (may be negative). */
  add(labels: Labels, n: number): void {
    this.addTo(labels, n);
  }
}

/** Cumulative-bucket histogram per label set. */
export class Histogram extends Metric {
  readonly #series = new Map<string, { counts: number[]; sum: number; count: number }>();
  /** @param buckets upper bounds, ascending (+Inf is implied) */
  constructor(name: string, help: string, readonly buckets: readonly number[]) {
    super(name, help, "histogram");
  }
  /** Records one observation. */
  observe(labels: Labels, v: number): void {
    const k = labelKey(labels);
    let s = this.#series.get(k);
    if (!s) {
      s = { counts: new Array(this.buckets.length).fill(0), sum: 0, count: 0 };
      this.#series.set(k, s);
    }
    for (let i = 0; i < this.buckets.length; i++) if (v <= this.buckets[i]) s.counts[i]++;
    s.sum += v;
    s.count++;
  }
  /** Number of observations of one series. */
  count(labels: Labels = {}): number {
    return this.#series.get(labelKey(labels))?.count ?? 0;
  }
  render(): string[] {
    const out: string[] = [];
    for (const [k, s] of this.#series) {
      const sep = k ? `${k},` : "";
      this.buckets.forEach((b, i) =>
        out.push(`${this.name}_bucket{${sep}le="${b}"} ${s.counts[i]}`)
      );
      out.push(`${this.name}_bucket{${sep}le="+Inf"} ${s.count}`);
      out.push(`${this.name}_sum${k ? `{${k}}` : ""} ${s.sum}`);
      out.push(`${this.name}_count${k ? `{${k}}` : ""} ${s.count}`);
    }
    return out;
  }
}

/** Bucket upper bounds of the process's histograms (+Inf implied). */
export const BUCKETS = {
  /** Time to first token, seconds. */
  ttftSeconds: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
  /** Decode throughput of one request, tokens/s. */
  tokensPerSecond: [1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500],
  /** Sequences in one batched engine step. */
  batchSize: [1, 2, 4, 8, 16, 32, 64, 128],
} as const;

/** The metrics of one kvrelay process, shared by every function it serves. */
export class Metrics {
  readonly #all: Metric[] = [];
  /** HTTP requests by function route and status. */
  readonly requests = this.#add(
    new Counter("kvrelay_http_requests_total", "HTTP requests by route and status"),
  );
  /** Error responses by error type. */
  readonly errors = this.#add(new Counter("kvrelay_errors_total", "Error responses by error type"));
  /** Admitted requests waiting, per tier: for a slot (no batching), or to start in the scheduler. */
  readonly queueDepth = this.#add(
    new Gauge("kvrelay_queue_depth", "Admitted requests waiting for a slot or to start"),
  );
  /** Native sequences alive (prefilling, decoding or exporting), per tier. */
  readonly activeSequences = this.#add(
    new Gauge("kvrelay_active_sequences", "Native sequences alive per tier"),
  );
  /** 1 per tier, labelled with the backend and device its model runs on (an info metric). */
  readonly backendInfo = this.#add(
    new Gauge("kvrelay_tier_backend_info", "Compute backend and device of each tier's model"),
  );
  /** Requests refused because the queue was full. */
  readonly rejected = this.#add(
    new Counter("kvrelay_queue_rejected_total", "Requests refused: queue full"),
  );
  /** Generations ended by a client disconnect or timeout. */
  readonly aborted = this.#add(
    new Counter("kvrelay_generations_aborted_total", "Generations stopped early by reason"),
  );
  /** Time to first token, seconds. */
  readonly ttft = this.#histogram("kvrelay_ttft_seconds", "Time to first token", "ttftSeconds");
  /** Decode throughput of a request, tokens/s. */
  readonly tokensPerSecond = this.#histogram(
    "kvrelay_tokens_per_second",
    "Generated tokens per second per request",
    "tokensPerSecond",
  );
  /** Tokens generated. */
  readonly tokens = this.#add(new Counter("kvrelay_generated_tokens_total", "Tokens generated"));
  /** Prefix-cache lookups that reused cached KV. */
  readonly prefixHits = this.#add(
    new Counter("kvrelay_prefix_cache_hits_total", "Prefix-cache hits"),
  );
  /** Prefix-cache lookups that found nothing. */
  readonly prefixMisses = this.#add(
    new Counter("kvrelay_prefix_cache_misses_total", "Prefix-cache misses"),
  );
  /** Prompt tokens whose prefill was skipped thanks to a cache. */
  readonly reusedTokens = this.#add(
    new Counter("kvrelay_prefix_cache_reused_tokens_total", "Prompt tokens not prefilled"),
  );
  /** Pool blocks a prefix-cache hit shared with the cache (adopted, no KV copied), per tier. */
  readonly prefixSharedBlocks = this.#add(
    new Counter(
      "kvrelay_prefix_cache_shared_blocks_total",
      "KV pool blocks prefix-cache hits shared instead of copying",
    ),
  );
  /** KV bytes copied into a sequence to serve a prefix-cache hit (0 for shared pool blocks; a
   *  hit from the snapshot store imports its chunks), per tier. */
  readonly prefixCopiedBytes = this.#add(
    new Counter(
      "kvrelay_prefix_cache_copied_bytes_total",
      "KV bytes copied to serve prefix-cache hits (shared pool blocks copy none)",
    ),
  );
  /** Pool blocks the in-pool prefix cache holds now, per tier. */
  readonly prefixCachedBlocks = this.#add(
    new Gauge("kvrelay_prefix_cache_blocks", "KV pool blocks held by the prefix cache"),
  );
  /** Escalations served by migrating a lower tier's cache. */
  readonly migrations = this.#add(new Counter("kvrelay_migrations_total", "Cache migrations"));
  /** Escalations that fell back to a full prefill, by reason. */
  readonly fallbacks = this.#add(
    new Counter("kvrelay_migration_fallbacks_total", "Escalations that fell back to full prefill"),
  );
  /** Bytes of request bodies (JSON and snapshot uploads) held by this process now, as received. */
  readonly inflightBodyBytes = this.#add(
    new Gauge("kvrelay_inflight_body_bytes", "Request body bytes held now (JSON and snapshots)"),
  );
  /** Response bodies aborted because their client did not take them by the request deadline. */
  readonly writeTimeouts = this.#add(
    new Counter(
      "kvrelay_write_timeouts_total",
      "Responses aborted: not read by the client within the request deadline",
    ),
  );
  /** Snapshot bytes sent and received. */
  readonly snapshotBytes = this.#add(
    new Counter("kvrelay_snapshot_bytes_total", "Snapshot bytes by direction"),
  );
  /** Client connections open now (functions/shared/connections.ts). */
  readonly openConnections = this.#add(
    new Gauge("kvrelay_open_connections", "Client HTTP connections open now"),
  );
  /** Connections refused at accept, by reason (limit: server.max_connections reached;
   *  relay_failed: no descriptor left to reach Deno.serve). */
  readonly connectionsRefused = this.#add(
    new Counter("kvrelay_connections_refused_total", "Connections refused at accept by reason"),
  );
  /** Connections closed by a timeout, by reason (idle, head). */
  readonly connectionsTimedOut = this.#add(
    new Counter("kvrelay_connections_timed_out_total", "Connections closed by a timeout by reason"),
  );
  /** Failed accepts of the listening socket (EMFILE and friends; the server keeps serving). */
  readonly acceptErrors = this.#add(
    new Counter("kvrelay_accept_errors_total", "Failed accepts on the listening socket"),
  );

  /** Sequences per batched step (continuous batching), per tier. */
  readonly batchSize = this.#histogram(
    "kvrelay_batch_size",
    "Sequences per batched engine step",
    "batchSize",
  );
  /** Tokens per batched step (decodes + prefill chunk), per tier. */
  readonly stepTokens = this.#add(
    new Counter("kvrelay_batch_step_tokens_total", "Tokens computed in batched steps by kind"),
  );
  /** Paged KV blocks in use, per tier. */
  readonly kvBlocksUsed = this.#add(
    new Gauge("kvrelay_kv_blocks_used", "Paged KV blocks held by sequences"),
  );
  /** Paged KV blocks free, per tier. */
  readonly kvBlocksFree = this.#add(new Gauge("kvrelay_kv_blocks_free", "Paged KV blocks free"));
  /** Sequences preempted (KV dropped, recomputed later) because the pool ran dry, per tier. */
  readonly preemptions = this.#add(
    new Counter("kvrelay_preemptions_total", "Sequences preempted for KV blocks (recomputed)"),
  );

  #histogram(name: string, help: string, buckets: keyof typeof BUCKETS): Histogram {
    return this.#add(new Histogram(name, help, BUCKETS[buckets]));
  }

  #add<T extends Metric>(m: T): T {
    this.#all.push(m);
    return m;
  }

  /**
   * Renders every metric in Prometheus text format.
   * @returns the exposition text
   */
  render(): string {
    const lines: string[] = [];
    for (const m of this.#all) {
      lines.push(`# HELP ${m.name} ${m.help}`, `# TYPE ${m.name} ${m.type}`, ...m.render());
    }
    return lines.join("\n") + "\n";
  }
}
