// Fitting a linear KV projector (docs/migration.md): run both models over calibration windows, strip
// RoPE from keys, stream float64 XᵀX/XᵀY into native accumulators straight from the two caches
// (RidgeAccumulator.accumulateSequences: on the device for CUDA models; train and held-out splits),
// then per target layer and per K/V choose source layers and λ on the held-out split and solve
// by Cholesky. Temperature is fitted afterwards on held-out windows. No file I/O (see CLI).

import type { LoadedModel } from "../engine/mod.ts";
import type { NativeSequence } from "../native/mod.ts";
import { type LayerMapEntry, type LayerWeights, modelRef, type ProjectorMeta } from "./artifact.ts";
import { MigrationRefusedError } from "./errors.ts";
import { evaluateMigration } from "./evaluate.ts";
import { featureWidth, RidgeAccumulator } from "./native.ts";
import type { Projector } from "./projector.ts";
import { LinearKernel } from "./native.ts";
import { denseWeights } from "./artifact.ts";
import { fitTemperature } from "./temperature.ts";

/** Relative λ grid searched when lambda is "auto" (penalty = λ × mean feature variance). */
export const LAMBDA_GRID = [1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1];

/** Options of {@link fitLinearProjector}. */
export interface FitOptions {
  /** training tokens (rounded down to whole windows); default 65536 */
  tokens?: number;
  /** held-out tokens taken after the training windows; default tokens/4 */
  heldoutTokens?: number;
  /** calibration window length (the demo models were trained on 256); default 256 */
  windowTokens?: number;
  /** "auto" (grid search on held-out) or a fixed relative λ >= 0 */
  lambda?: "auto" | number;
  /** source layers feeding each target layer: "auto" (best top-k on held-out), "all", or k */
  sourceLayers?: "auto" | "all" | number;
  /** default repair length stored in the artifact; default 8 */
  repairDefault?: number;
  /** fit a temperature on held-out windows (default true) */
  temperature?: boolean;
  /** corpus description stored in the artifact */
  corpus: string[];
  /** progress: phase name, done, total */
  onProgress?: (phase: string, done: number, total: number) => void;
}

/** A fitted projector ready to write (quality filled in by the caller's evaluation). */
export interface FitResult {
  meta: ProjectorMeta;
  layers: LayerWeights[];
}

async function prefillWindow(seq: NativeSequence, window: number[]): Promise<void> {
  seq.truncate(0);
  await seq.prefill(window);
}

function layerFeatures(layers: number[], per: number): number[] {
  return layers.flatMap((l) => Array.from({ length: per }, (_, i) => l * per + i));
}

interface Choice {
  layers: number[];
  lambda: number;
  sse: number;
  sst: number;
  w: Float64Array;
  bias: Float64Array;
}

/** Picks source layers and λ for one output block on the held-out split; returns the best fit. */
function chooseMap(
  train: RidgeAccumulator,
  held: RidgeAccumulator,
  srcLayers: number,
  per: number,
  outStart: number,
  outCount: number,
  grid: number[],
  mode: "auto" | "all" | number,
): Choice {
  const score = (layers: number[], lambda: number): Choice => {
    const feats = layerFeatures(layers, per);
    const sol = train.solve(feats, outStart, outCount, lambda);
    const { sse, sst } = held.sse(feats, outStart, sol);
    return {
      layers,
      lambda,
      sse: sse.reduce((a, b) => a + b, 0),
      sst: sst.reduce((a, b) => a + b, 0),
      ...sol,
    };
  };
  const all = Array.from({ length: srcLayers }, (_, l) => l);
  let candidates: number[][];
  if (mode === "all" || srcLayers === 1) {
    candidates = [all];
  } else {
    // rank single source layers by held-out error at a mid λ, then try top-k prefixes
    const ranked = all
      .map((l) => ({ l, sse: score([l], 1e-3).sse }))
      .sort((a, b) => a.sse - b.sse)
      .map((x) => x.l);
    const ks = mode === "auto" ? all.map((_, i) => i + 1) : [Math.min(mode, srcLayers)];
    candidates = ks.map((k) => ranked.slice(0, k).sort((a, b) => a - b));
  }
  let best: Choice | null = null;
  for (const layers of candidates) {
    for (const lambda of grid) {
      let c: Choice;
      try {
        c = score(layers, lambda);
      } catch {
        continue; // not positive definite at this λ: a larger λ will be tried
      }
      if (best === null || c.sse < best.sse) best = c;
    }
  }
  if (best === null) {
    throw new RangeError(`no λ in ${JSON.stringify(grid)} gives a positive definite system`);
  }
  return best;
}

/**
 * Fits a linear projector source → target on token ids (the calibration corpus).
 * @param source source model
 * @param target target model (same tokenizer)
 * @param ids calibration token ids; training windows first, held-out windows after them
 * @param opts tokens, λ, source layer selection, progress
 * @returns projector metadata (quality null) and per-layer weights
 * @throws MigrationRefusedError for different tokenizers; RangeError for too few tokens or bad
 *   options; EngineError from native calls
 */
export async function fitLinearProjector(
  source: LoadedModel,
  target: LoadedModel,
  ids: ArrayLike<number>,
  opts: FitOptions,
): Promise<FitResult> {
  if (source.tokenizer.fingerprint !== target.tokenizer.fingerprint) {
    throw new MigrationRefusedError(
      "tokenizer_mismatch",
      `${source.name} and ${target.name} use different tokenizers`,
    );
  }
  const win = opts.windowTokens ?? 256;
  const tokens = opts.tokens ?? 65536;
  const heldTokens = opts.heldoutTokens ?? Math.max(win, Math.floor(tokens / 4));
  if (!Number.isInteger(win) || win < 2) {
    throw new RangeError(`windowTokens must be an integer >= 2, got ${win}`);
  }
  const nTrain = Math.floor(tokens / win), nHeld = Math.floor(heldTokens / win);
  if (nTrain < 1 || nHeld < 1) {
    throw new RangeError(
      `need >= 1 training and held-out window of ${win} tokens (tokens ${tokens}, held-out ${heldTokens})`,
    );
  }
  if ((nTrain + nHeld) * win > ids.length) {
    throw new RangeError(
      `corpus has ${ids.length} tokens, need ${
        (nTrain + nHeld) * win
      } (${nTrain} + ${nHeld} windows of ${win})`,
    );
  }
  const lambdaMode = opts.lambda ?? "auto";
  const grid = lambdaMode === "auto" ? LAMBDA_GRID : [lambdaMode];
  if (lambdaMode !== "auto" && (!Number.isFinite(lambdaMode) || lambdaMode < 0)) {
    throw new RangeError(`lambda must be "auto" or >= 0, got ${lambdaMode}`);
  }
  const selection = opts.sourceLayers ?? "auto";
  const sc = source.native.config, tc = target.native.config;
  const ns = featureWidth(sc), nt = featureWidth(tc);
  const t0 = performance.now();
  const accs = {
    trainK: new RidgeAccumulator(ns, nt),
    trainV: new RidgeAccumulator(ns, nt),
    heldK: new RidgeAccumulator(ns, nt),
    heldV: new RidgeAccumulator(ns, nt),
  };
  const sseq = source.native.createSequence(win), tseq = target.native.createSequence(win);
  try {
    const total = nTrain + nHeld;
    for (let w = 0; w < total; w++) {
      const window = Array.from({ length: win }, (_, i) => ids[w * win + i]);
      await prefillWindow(sseq, window);
      await prefillWindow(tseq, window);
      const [k, v] = w < nTrain ? [accs.trainK, accs.trainV] : [accs.heldK, accs.heldV];
      // features never cross into JavaScript: native (CPU) or device (CUDA) accumulation
      await RidgeAccumulator.accumulateSequences(k, v, sseq, tseq, win);
      opts.onProgress?.("calibration windows", w + 1, total);
    }
    sseq.free();
    tseq.free();
    const per = sc.numKvHeads * sc.headDim, out = tc.numKvHeads * tc.headDim;
    const layerMap: LayerMapEntry[] = [], layers: LayerWeights[] = [];
    for (let t = 0; t < tc.numLayers; t++) {
      const k = chooseMap(
        accs.trainK,
        accs.heldK,
        sc.numLayers,
        per,
        t * out,
        out,
        grid,
        selection,
      );
      const v = chooseMap(
        accs.trainV,
        accs.heldV,
        sc.numLayers,
        per,
        t * out,
        out,
        grid,
        selection,
      );
      layerMap.push({
        target_layer: t,
        k_source_layers: k.layers,
        v_source_layers: v.layers,
        k_lambda: k.lambda,
        v_lambda: v.lambda,
        k_heldout_r2: 1 - k.sse / k.sst,
        v_heldout_r2: 1 - v.sse / v.sst,
      });
      layers.push({
        kWeight: Float32Array.from(k.w),
        kBias: Float32Array.from(k.bias),
        vWeight: Float32Array.from(v.w),
        vBias: Float32Array.from(v.bias),
      });
      opts.onProgress?.("solve", t + 1, tc.numLayers);
    }
    const fitSeconds = (performance.now() - t0) / 1000;
    const meta: ProjectorMeta = {
      format: "kvrelay-projector",
      version: 1,
      kind: "linear",
      source: modelRef(source.name, source.fingerprint, sc),
      target: modelRef(target.name, target.fingerprint, tc),
      tokenizer_fingerprint: source.tokenizer.fingerprint,
      features: {
        layout:
          "per token (layer, kv_head, dim) concatenated; keys without RoPE (after k_norm for Qwen3); values as cached",
        source_width: ns,
        target_width: nt,
      },
      layer_map: layerMap,
      lambda: {
        mode: lambdaMode === "auto" ? "auto" : "fixed",
        grid,
        scale:
          "relative: penalty = lambda × mean variance of the selected features; intercept unpenalised",
      },
      source_layer_selection: selection,
      repair_default: opts.repairDefault ?? 8,
      temperature: null,
      calibration: {
        corpus: opts.corpus,
        tokens: nTrain * win,
        heldout_tokens: nHeld * win,
        window_tokens: win,
        train_windows: nTrain,
        heldout_windows: nHeld,
        fit_seconds: Math.round(fitSeconds * 10) / 10,
        mean_heldout_r2: {
          k: layerMap.reduce((a, e) => a + (e.k_heldout_r2 ?? 0), 0) / layerMap.length,
          v: layerMap.reduce((a, e) => a + (e.v_heldout_r2 ?? 0), 0) / layerMap.length,
        },
      },
      quality: null,
    };
    if (opts.temperature !== false) {
      // temperature: predictions from migrated caches (repair_default) on the held-out windows
      const d = denseWeights(meta, layers);
      const kernel = new LinearKernel(sc, tc, d.wk, d.bk, d.wv, d.bv);
      const proj: Projector = {
        dir: "",
        meta,
        project: (p, b, th) => kernel.apply(p, b, th),
        free: () => Promise.resolve(kernel.free()),
      };
      try {
        const heldIds = Array.from({ length: nHeld * win }, (_, i) => ids[nTrain * win + i]);
        const C = Math.min(64, Math.floor(win / 4)), P = win - C;
        const r = Math.min(meta.repair_default, P - 1);
        const ev = await evaluateMigration(source, target, proj, heldIds, {
          prefix: P,
          continuation: C,
          repairs: [r],
          maxWindows: 24,
          collectRepair: r,
          onProgress: (d2, t2) => opts.onProgress?.("temperature windows", d2, t2),
        });
        const fitT = fitTemperature(ev.rows!);
        meta.temperature = fitT.temperature;
        meta.calibration.temperature_fit = {
          windows: ev.windows,
          prefix: P,
          continuation: C,
          repair: r,
          nll_before: fitT.nllBefore,
          nll_after: fitT.nllAfter,
        };
      } finally {
        await proj.free();
      }
    }
    meta.calibration.fit_seconds = Math.round((performance.now() - t0) / 100) / 10;
    return { meta, layers };
  } finally {
    sseq.free();
    tseq.free();
    for (const a of Object.values(accs)) a.free();
  }
}
