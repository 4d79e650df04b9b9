// Each bench section's result object as the flat rows of bench/results/<section>.json
// (result_file.ts). One function per section; they read only the fields the tables need, so a
// section can keep extra detail (traces, per-configuration screens) on stdout.
import type { BatchBenchResult } from "./batch.ts";
import type { ColdStartResult } from "./coldstart.ts";
import type { EngineBenchResult } from "./engine.ts";
import type { GrammarBenchResult } from "./grammar.ts";
import type { HttpBenchResult } from "./http.ts";
import type { ServeLoadResult } from "./serve_load.ts";
import type { MultihostResult } from "./multihost.ts";
import type { PeersResult } from "./peers.ts";
import { type ResultRow, row } from "./result_file.ts";
import type { SnapshotBenchRow } from "./snapshot.ts";
import type { PairRow } from "./migration.ts";

const TPS = "tokens/s";

function engineRows(r: EngineBenchResult): ResultRow[] {
  const rows: ResultRow[] = [];
  for (const m of r.models) {
    const labels = { model: m.model, weights: m.weights, threads: m.threads };
    for (const [n, tps] of Object.entries(m.prefillTokensPerSecond)) {
      rows.push(row(labels, `prefill${n}`, TPS, m.runs?.prefill[n] ?? tps));
    }
    rows.push(
      row(labels, `decode@${m.decodeContext}`, TPS, m.runs?.decode ?? m.decodeTokensPerSecond),
    );
  }
  for (const q of r.quantKernels) {
    rows.push(
      row(
        { model: q.model, weights: q.weights, threads: 1, kernel: q.kernel },
        "decode",
        TPS,
        q.decodeTokensPerSecond,
      ),
    );
  }
  for (const g of r.gemm) {
    rows.push(
      row(
        { kernel: g.kernel, shape: g.shape.join("×"), threads: g.threads },
        "GEMM",
        "GFLOP/s",
        g.gflops,
      ),
    );
  }
  return rows;
}

function snapshotRows(r: { rows: SnapshotBenchRow[] }): ResultRow[] {
  return r.rows.flatMap((s) => {
    const labels = { model: s.model, cache: s.cacheDtype, encoding: s.encoding };
    return [
      row(labels, "size", "bytes/token", s.bytesPerToken),
      row(labels, "export", "MB/s", s.encodeMBps),
      row(labels, "import", "MB/s", s.decodeMBps),
      row(labels, "Δ cross-entropy", "nats/token", s.deltaCrossEntropy),
    ];
  });
}

function migrationRows(r: { pairs: Record<string, PairRow> }): ResultRow[] {
  const rows: ResultRow[] = [];
  for (const [pair, p] of Object.entries(r.pairs)) {
    for (const [repair, q] of Object.entries(p.quality?.repair ?? {})) {
      const labels = { pair, kind: p.kind, repair: Number(repair) };
      rows.push(row(labels, "recovered", "fraction", q.recovered));
      rows.push(row(labels, "KL recovered", "fraction", q.kl_recovered));
      rows.push(row(labels, "top-1 agreement", "fraction", q.top1_agreement));
    }
    for (const s of p.speed) {
      const base = { pair, kind: p.kind, prompt: s.prompt_tokens };
      rows.push(row({ ...base, path: "full prefill" }, "TTFT", "ms", s.full_ttft_ms));
      for (const [repair, t] of Object.entries(s.repair)) {
        rows.push(row({ ...base, path: `migrate + repair ${repair}` }, "TTFT", "ms", t.ttft_ms));
      }
    }
  }
  return rows;
}

function httpRows(r: HttpBenchResult): ResultRow[] {
  const rows: ResultRow[] = [];
  for (const [tier, points] of Object.entries(r.tiers)) {
    for (const p of points) {
      const labels = { tier, concurrency: p.concurrency };
      rows.push(row(labels, "TTFT p50", "ms", p.ttftMs.p50));
      rows.push(row(labels, "TTFT p99", "ms", p.ttftMs.p99));
      rows.push(row(labels, "aggregate", TPS, p.aggregateTokensPerSecond));
    }
  }
  rows.push(
    row({ tier: "fast", concurrency: 1 }, "HTTP overhead p50", "ms", r.overhead.overheadMsP50),
  );
  const hd = r.handoff;
  if (hd) {
    for (const p of hd.points) {
      const metric = p.path === "handoff" ? "handoff aggregate" : "direct aggregate";
      rows.push(
        row(
          { tier: "powerful", concurrency: p.concurrency },
          metric,
          TPS,
          p.aggregateTokensPerSecond,
        ),
      );
    }
    rows.push(
      row(
        { tier: "powerful", concurrency: 32 },
        "handoffs vs one at a time",
        "×",
        hd.concurrentVsAlone,
      ),
    );
    rows.push(
      row({ tier: "powerful", concurrency: 32 }, "handoffs vs direct", "×", hd.handoffVsDirect),
    );
  }
  const ps = r.prefixSharing;
  if (ps) {
    const labels = { tier: ps.tier, shared_prefix: ps.prefixTokens };
    rows.push(row({ ...labels, request: "first" }, "TTFT", "ms", ps.firstMs));
    rows.push(row({ ...labels, request: "second" }, "TTFT", "ms", ps.secondMs));
    rows.push(row(labels, "TTFT second / first", "ratio", ps.ratios));
  }
  for (const p of r.probes?.probes ?? []) {
    const labels = { tier: "all", concurrency: r.probes.streamsPerTier, path: p.path };
    rows.push(row(labels, "probe p50", "ms", p.ms.p50));
    rows.push(row(labels, "probe p99", "ms", p.ms.p99));
  }
  return rows;
}

function batchRows(r: BatchBenchResult): ResultRow[] {
  const rows: ResultRow[] = [];
  for (const t of r.throughput) {
    rows.push(row({ model: t.model, mode: "alone", concurrency: 1 }, "decode", TPS, t.aloneTps));
    rows.push(
      row({ model: t.model, mode: "batched", concurrency: 1 }, "decode", TPS, t.batched1Tps),
    );
    rows.push(
      row({ model: t.model, mode: "batched", concurrency: 32 }, "decode", TPS, t.batched32Tps),
    );
    rows.push(
      row(
        { model: t.model, mode: "batched", concurrency: 32 },
        "inter-token p99",
        "ms",
        t.tpot32Ms.p99,
      ),
    );
  }
  const c = r.chunkedPrefill;
  const chunk = { model: c.model, decoders: c.decoders, prompt: c.promptTokens };
  rows.push(row(chunk, "decode step", "ms", c.decodeStepMs));
  rows.push(row(chunk, "step with a prompt chunk", "ms", c.chunkStepMs));
  rows.push(row(chunk, "added inter-token delay", "ms", c.addedDelayMs));
  const k = r.kvMemory;
  const kv = { model: k.model, sequences: k.sequences, "pool blocks": k.poolBlocks };
  rows.push(row(kv, "peak blocks used", "blocks", k.peakBlocksUsed));
  rows.push(row(kv, "preemptions", "count", k.preemptions));
  return rows;
}

function coldstartRows(r: ColdStartResult): ResultRow[] {
  return r.cases.flatMap((c) => {
    const labels = { case: c.name, load: c.load };
    return [
      row(labels, "listening", "ms", c.runs.map((x) => x.listenMs)),
      row(labels, "ready", "ms", c.runs.map((x) => x.readyMs)),
      row(labels, "first token", "ms", c.runs.map((x) => x.firstTokenMs)),
      row(labels, "RSS", "MiB", c.runs.map((x) => x.rss.totalMiB)),
    ];
  });
}

function multihostRows(r: MultihostResult): ResultRow[] {
  if (!r.rows) return [];
  const labels = { prompt: r.promptTokens ?? 0 };
  return [
    row({ ...labels, encoding: "none (full prefill)" }, "TTFT", "ms", r.fullPrefillTtftMs ?? NaN),
    ...r.rows.flatMap((e) => [
      row({ ...labels, encoding: e.encoding }, "snapshot", "bytes", e.snapshotBytes),
      row({ ...labels, encoding: e.encoding }, "TTFT warm", "ms", e.warmTtftMs),
      row({ ...labels, encoding: e.encoding }, "TTFT cold", "ms", e.coldTtftMs),
    ]),
  ].filter((x) => Number.isFinite(x.median));
}

/** Peers: per model, format and column, kvrelay and llama.cpp's best configuration. */
function peersRows(r: PeersResult): ResultRow[] {
  const rows: ResultRow[] = [];
  for (const m of r.models) {
    for (const f of m.formats) {
      for (const column of Object.keys(f.llamaBest) as (keyof typeof f.llamaBest)[]) {
        const labels = { model: m.model, weights: f.format };
        const rounds = f.rounds?.[column];
        const kv = f.kvrelay?.[column];
        if (kv !== undefined) {
          rows.push(
            row(
              { ...labels, engine: "kvrelay" },
              column,
              TPS,
              rounds?.kvrelay.length ? rounds.kvrelay : kv,
            ),
          );
        }
        const best = f.llamaBest[column];
        rows.push(
          row(
            { ...labels, engine: `llama.cpp (${best.config})` },
            column,
            TPS,
            rounds?.llamaBest.length ? rounds.llamaBest : best.tokensPerSecond,
          ),
        );
      }
    }
  }
  return rows;
}

function serveRows(r: ServeLoadResult): ResultRow[] {
  return r.points.map((p) =>
    row(
      { tier: p.tier, mode: p.mode, concurrency: p.concurrency },
      `aggregate (${r.maxTokens} tokens)`,
      TPS,
      p.tokensPerSecond,
    )
  );
}

function grammarRows(r: GrammarBenchResult): ResultRow[] {
  const rows: ResultRow[] = [];
  for (const v of r.vocabs) {
    const labels = { vocabulary: v.vocab, ids: v.vocabSize };
    rows.push(row(labels, "schema compile", "ms", v.compileMs));
    rows.push(row(labels, "bitmask per token", "µs", v.bitmaskUs));
    rows.push(row(labels, "accept per token", "µs", v.acceptUs));
    rows.push(row(labels, "native draw", "µs", v.drawUs));
    rows.push(row(labels, "native masked draw", "µs", v.maskedDrawUs));
  }
  for (const d of r.decode) {
    const labels = { model: "tiny-fast", rows: d.rows, threads: d.threads };
    rows.push(row({ ...labels, output: "free" }, "decode", TPS, d.unconstrained));
    rows.push(row({ ...labels, output: "json_schema, drawn first" }, "decode", TPS, d.drawFirst));
    rows.push(row({ ...labels, output: "json_schema, masked first" }, "decode", TPS, d.maskFirst));
    rows.push(row({ ...labels, output: "free, greedy" }, "decode", TPS, d.greedyUnconstrained));
    rows.push(row({ ...labels, output: "json_schema, greedy" }, "decode", TPS, d.greedyDrawFirst));
  }
  return rows;
}

/** Row builders by section name (bench/main.ts's sections). */
export const SECTION_ROWS: Record<string, (result: never) => ResultRow[]> = {
  engine: engineRows,
  snapshot: snapshotRows,
  migration: migrationRows,
  http: httpRows,
  serve: serveRows,
  batch: batchRows,
  coldstart: coldstartRows,
  multihost: multihostRows,
  grammar: grammarRows,
  peers: peersRows,
};
