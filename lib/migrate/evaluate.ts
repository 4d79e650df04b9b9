// Migration quality, measured (docs/migration.md): a token sequence cut into consecutive windows of
// P+C tokens; tokens w[P+1..P+C−1] are scored (a) with full target prefill, (b) with positions
// 0..P−r−1 migrated from the source cache and the rest computed by the target, (c) with no
// prefix; NLL, "gap recovered", KL and top-1 agreement vs full, TTFT of (b) vs (a). No CLI here.

import type { LoadedModel } from "../engine/mod.ts";
import type { NativeSequence } from "../native/mod.ts";
import type { Quality, RepairMetrics } from "./artifact.ts";
import { endpointOf, migrateKv } from "./migrate.ts";
import type { Projector } from "./projector.ts";
import { argmaxOf, klDivergence, logSoftmaxRow, type ScoredRows } from "./temperature.ts";

/** Options of {@link evaluateMigration}. */
export interface EvalOptions {
  /** P: prompt tokens per window (>= 2) */
  prefix: number;
  /** C: continuation tokens per window (>= 2); C−1 tokens are scored */
  continuation: number;
  /** repair lengths r, each 1..P−1 */
  repairs: number[];
  /** use at most this many windows (default all) */
  maxWindows?: number;
  /** fitted temperature: metrics of migrated predictions at T are reported too */
  temperature?: number | null;
  /** collect migrated (b) logits rows for this r (for temperature fitting) */
  collectRepair?: number;
  /** progress callback (windows done, total) */
  onProgress?: (done: number, total: number) => void;
}

/** Metrics at the fitted temperature, per repair length. */
export interface TemperatureMetrics {
  value: number;
  repair: Record<string, Omit<RepairMetrics, "ttft_ms">>;
}

/** Result of {@link evaluateMigration}: the eval-migration JSON object. */
export interface EvalResult {
  windows: number;
  full_nll: number;
  no_prefix_nll: number;
  source_nll: number;
  no_prefix_kl: number;
  no_prefix_top1_agreement: number;
  /** median over windows: target prefill of the P prompt tokens, ms */
  full_ttft_ms: number;
  repair: Record<string, RepairMetrics>;
  /** median over windows: source prefill of the P prompt tokens (not part of either TTFT), ms */
  source_prefill_ms: number;
  /** scored tokens per window (C − 1) × windows */
  scored_tokens: number;
  temperature?: TemperatureMetrics;
}

function median(a: number[]): number {
  const s = [...a].sort((x, y) => x - y);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

class Acc {
  nll = 0;
  kl = 0;
  top1 = 0;
  n = 0;
  add(logFull: Float64Array, logX: Float64Array, target: number): void {
    this.nll -= logX[target];
    this.kl += klDivergence(logFull, logX);
    if (argmaxOf(logFull) === argmaxOf(logX)) this.top1++;
    this.n++;
  }
}

/**
 * Runs the three-way evaluation. Source and target must share a tokenizer; `projector` may be
 * null only when they are the same model (exact copy).
 * @param source source model (computes the prompt cache)
 * @param target target model
 * @param projector projector for the pair, or null for the same model
 * @param ids the token sequence (e.g. a whole file encoded without special tokens)
 * @param opts P, C, repair lengths, window limit, temperature
 * @returns metrics; `recovered = (nll_c − nll_b)/(nll_c − nll_a)`, `kl_recovered = 1 − kl_b/kl_c`
 * @throws RangeError for bad P/C/r or too few tokens for one window; MigrationRefusedError for a
 *   mismatched pair; EngineError from native calls
 */
export async function evaluateMigration(
  source: LoadedModel,
  target: LoadedModel,
  projector: Projector | null,
  ids: ArrayLike<number>,
  opts: EvalOptions,
): Promise<EvalResult & { rows?: ScoredRows[] }> {
  const P = opts.prefix, C = opts.continuation;
  if (!Number.isInteger(P) || P < 2) {
    throw new RangeError(`prefix must be an integer >= 2, got ${P}`);
  }
  if (!Number.isInteger(C) || C < 2) {
    throw new RangeError(`continuation must be an integer >= 2, got ${C}`);
  }
  if (opts.repairs.length === 0) throw new RangeError("repairs is empty");
  for (const r of opts.repairs) {
    if (!Number.isInteger(r) || r < 1 || r >= P) {
      throw new RangeError(`repair ${r} must be an integer in [1, ${P - 1}]`);
    }
  }
  const W = P + C;
  let windows = Math.floor(ids.length / W);
  if (opts.maxWindows !== undefined) windows = Math.min(windows, opts.maxWindows);
  if (windows < 1) throw new RangeError(`${ids.length} tokens do not fill one window of ${W}`);
  const T = opts.temperature ?? null;
  const src = endpointOf(source), tgt = endpointOf(target);
  const vocab = target.native.config.vocabSize;
  const full = new Acc(), none = new Acc(), srcAcc = new Acc();
  const mig = new Map(opts.repairs.map((r) => [r, new Acc()]));
  const migT = new Map(opts.repairs.map((r) => [r, new Acc()]));
  const ttftFull: number[] = [], ttftSrc: number[] = [];
  const ttftMig = new Map(opts.repairs.map((r) => [r, [] as number[]]));
  const rows: ScoredRows[] = [];
  const seqs: NativeSequence[] = [];
  try {
    const tseq = target.native.createSequence(W), sseq = source.native.createSequence(W);
    const mseq = target.native.createSequence(W);
    seqs.push(tseq, sseq, mseq);
    for (let w = 0; w < windows; w++) {
      const win = Array.from({ length: W }, (_, i) => ids[w * W + i]);
      const prompt = win.slice(0, P), cont = win.slice(P, W - 1); // C−1 tokens fed
      const targets = win.slice(P + 1, W); // scored tokens
      // (a) full target prefill
      tseq.truncate(0);
      let t0 = performance.now();
      await tseq.prefill(prompt);
      ttftFull.push(performance.now() - t0);
      const la = await tseq.prefill(cont, { allPositions: true });
      // source: prompt cache (migrated below) and its own NLL on the scored tokens
      sseq.truncate(0);
      t0 = performance.now();
      await sseq.prefill(prompt);
      ttftSrc.push(performance.now() - t0);
      const ls = await sseq.prefill(cont, { allPositions: true });
      // (c) no prefix
      tseq.truncate(0);
      const lc = await tseq.prefill(cont, { allPositions: true });
      const logFull = targets.map((_, r) => logSoftmaxRow(la, r, vocab));
      targets.forEach((y, r) => {
        none.add(logFull[r], logSoftmaxRow(lc, r, vocab), y);
        srcAcc.nll -= logSoftmaxRow(ls, r, source.native.config.vocabSize)[y];
        srcAcc.n++;
        full.nll -= logFull[r][y];
        full.n++;
      });
      // (b) migrated prefix + repair r
      for (const r of opts.repairs) {
        mseq.truncate(0);
        t0 = performance.now();
        await migrateKv({
          source: src,
          sourceSeq: sseq,
          target: tgt,
          targetSeq: mseq,
          projector,
          count: P - r,
        });
        await mseq.prefill(prompt.slice(P - r));
        ttftMig.get(r)!.push(performance.now() - t0);
        const lb = await mseq.prefill(cont, { allPositions: true });
        targets.forEach((y, i) => {
          mig.get(r)!.add(logFull[i], logSoftmaxRow(lb, i, vocab), y);
          if (T !== null) migT.get(r)!.add(logFull[i], logSoftmaxRow(lb, i, vocab, T), y);
        });
        if (opts.collectRepair === r) rows.push({ logits: lb, vocab, targets });
      }
      opts.onProgress?.(w + 1, windows);
    }
  } finally {
    for (const s of seqs) s.free();
  }
  const a = full.nll / full.n, c = none.nll / none.n, kc = none.kl / none.n;
  const metrics = (m: Acc) => {
    const b = m.nll / m.n, kb = m.kl / m.n;
    return {
      nll: b,
      recovered: (c - b) / (c - a),
      kl: kb,
      kl_recovered: 1 - kb / kc,
      top1_agreement: m.top1 / m.n,
    };
  };
  const result: EvalResult & { rows?: ScoredRows[] } = {
    windows,
    full_nll: a,
    no_prefix_nll: c,
    source_nll: srcAcc.nll / srcAcc.n,
    no_prefix_kl: kc,
    no_prefix_top1_agreement: none.top1 / none.n,
    full_ttft_ms: median(ttftFull),
    repair: Object.fromEntries(
      opts.repairs.map((
        r,
      ) => [String(r), { ...metrics(mig.get(r)!), ttft_ms: median(ttftMig.get(r)!) }]),
    ),
    source_prefill_ms: median(ttftSrc),
    scored_tokens: full.n,
  };
  if (T !== null) {
    result.temperature = {
      value: T,
      repair: Object.fromEntries(opts.repairs.map((r) => [String(r), metrics(migT.get(r)!)])),
    };
  }
  if (opts.collectRepair !== undefined) result.rows = rows;
  return result;
}

/**
 * The stored form of an evaluation (projector.json "quality").
 * @param r evaluation result
 * @param file the evaluated file
 * @param prefix P
 * @param continuation C
 * @returns the quality record
 */
export function qualityRecord(
  r: EvalResult,
  file: string,
  prefix: number,
  continuation: number,
): Quality {
  const {
    windows,
    full_nll,
    no_prefix_nll,
    source_nll,
    no_prefix_kl,
    no_prefix_top1_agreement,
    full_ttft_ms,
    repair,
  } = r;
  return {
    file,
    prefix,
    continuation,
    windows,
    full_nll,
    no_prefix_nll,
    source_nll,
    no_prefix_kl,
    no_prefix_top1_agreement,
    full_ttft_ms,
    repair,
    source_prefill_ms: r.source_prefill_ms,
    scored_tokens: r.scored_tokens,
    ...(r.temperature ? { temperature: r.temperature } : {}),
  };
}
