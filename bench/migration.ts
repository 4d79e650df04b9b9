// Migration benchmark: per committed demo projector, the stored quality at P=192, C=64
// on valid.txt (recovered, kl_recovered, top-1 for r ∈ {1, 8, 32}); and per pair and prompt
// length 512/2048 (beyond the demo models' trained context: time only) the TTFT of full target
// prefill vs migrate+repair(r) from a warm source cache, medians, with the migration split out
// (linear kind: also r=8 through the JS block path, for a same-run comparison).
// `--ablation` runs benchRopeAblation instead (RoPE handling variants of the linear map);
// `--profile` runs benchMigrationProfile (per-stage times of the two migration paths).
import { type LoadedModel, loadModel } from "../lib/engine/mod.ts";
import {
  endpointOf,
  evaluateMigration,
  featureWidth,
  kvToFeatures,
  LinearKernel,
  loadProjector,
  migrateAndRepair,
  type Projector,
  readCacheBlock,
  readProjectorMeta,
  RidgeAccumulator,
} from "../lib/migrate/mod.ts";
import { readCorpusTokens } from "../lib/migrate/corpus.ts";
import { writeCacheBlock } from "../lib/migrate/native.ts";
import type { ModelConfig } from "../lib/model/mod.ts";
import { gemmBench } from "../lib/native/gemm.ts";
import { median } from "./machine.ts";

const PAIRS = [
  "tiny-fast--tiny-powerful",
  "tiny-balanced--tiny-powerful",
  "tiny-fast--tiny-balanced",
];
const ONNX = "tiny-fast--tiny-powerful-mlp";
const LENGTHS = [512, 2048];
const REPAIRS = [1, 8, 32];
const RUNS = 5;

function promptIds(n: number, vocab: number): number[] {
  let state = 777;
  return Array.from({ length: n }, () => {
    state = (state * 1103515245 + 12345) >>> 0;
    return state % Math.min(vocab, 4093);
  });
}

/**
 * TTFT of full prefill vs migrate+repair for one pair and prompt length, ms (medians). Full and
 * migrated runs are interleaved so load from other processes hits both alike.
 */
async function timePair(source: LoadedModel, target: LoadedModel, projDir: string, n: number) {
  const proj = await loadProjector(projDir, endpointOf(source), endpointOf(target));
  try {
    const ids = promptIds(n, target.native.config.vocabSize);
    using src = source.native.createSequence(n);
    const s0 = performance.now();
    await src.prefill(ids); // warm source: computed once, not part of TTFT
    const sourceMs = performance.now() - s0;
    const full: number[] = [];
    const runs = new Map(
      REPAIRS.map((r) => [r, { ttft: [] as number[], mig: [] as number[], rep: [] as number[] }]),
    );
    // the same projector without its native sequence → sequence entry: f32 blocks through JS
    const blockPath: Projector | null = proj.projectInto
      ? { ...proj, projectInto: undefined }
      : null;
    const js = { ttft: [] as number[], mig: [] as number[], rep: [] as number[] };
    const migrate = async (p: Projector, r: number, x: typeof js) => {
      using dst = target.native.createSequence(n);
      const t0 = performance.now();
      const m = await migrateAndRepair({
        source: endpointOf(source),
        sourceSeq: src,
        target: endpointOf(target),
        targetSeq: dst,
        projector: p,
        prompt: ids,
        repair: r,
      });
      x.ttft.push(performance.now() - t0);
      x.mig.push(m.migrateMs);
      x.rep.push(m.repairMs);
    };
    for (let i = 0; i < RUNS; i++) {
      {
        using seq = target.native.createSequence(n);
        const t0 = performance.now();
        await seq.prefill(ids);
        full.push(performance.now() - t0);
      }
      for (const r of REPAIRS) await migrate(proj, r, runs.get(r)!);
      if (blockPath) await migrate(blockPath, 8, js);
    }
    const fullMs = median(full);
    const repair = Object.fromEntries(
      REPAIRS.map((r) => {
        const x = runs.get(r)!, t = median(x.ttft);
        return [String(r), {
          ttft_ms: t,
          migrate_ms: median(x.mig),
          repair_prefill_ms: median(x.rep),
          speedup: fullMs / t,
        }];
      }),
    );
    const jsPath = blockPath === null ? null : {
      repair: 8,
      ttft_ms: median(js.ttft),
      migrate_ms: median(js.mig),
      repair_prefill_ms: median(js.rep),
      speedup: fullMs / median(js.ttft),
    };
    return {
      prompt_tokens: n,
      full_ttft_ms: fullMs,
      source_prefill_ms: sourceMs,
      repair,
      js_block_path: jsPath,
    };
  } finally {
    await proj.free();
  }
}

/**
 * Runs the migration benchmark.
 * @returns JSON-ready results: machine, per-pair stored quality and TTFT table
 */
export async function benchMigration(): Promise<object> {
  const root = new URL("../", import.meta.url).pathname;
  const models = new Map<string, LoadedModel>();
  const model = async (name: string) => {
    if (!models.has(name)) models.set(name, await loadModel(`${root}models/${name}`));
    return models.get(name)!;
  };
  const pairs: Record<string, unknown> = {};
  try {
    for (const name of [...PAIRS, ONNX]) {
      const dir = `${root}models/projectors/${name}`;
      const meta = await readProjectorMeta(dir);
      const q = meta.quality;
      const quality = q === null ? null : {
        file: q.file,
        prefix: q.prefix,
        continuation: q.continuation,
        windows: q.windows,
        full_nll: q.full_nll,
        no_prefix_nll: q.no_prefix_nll,
        source_nll: q.source_nll,
        repair: Object.fromEntries(
          Object.entries(q.repair).map((
            [r, m],
          ) => [r, {
            recovered: m.recovered,
            kl_recovered: m.kl_recovered,
            top1_agreement: m.top1_agreement,
            ttft_ms: m.ttft_ms,
          }]),
        ),
        full_ttft_ms: q.full_ttft_ms,
      };
      const source = await model(meta.source.name), target = await model(meta.target.name);
      const speed = [];
      for (const n of LENGTHS) speed.push(await timePair(source, target, dir, n));
      pairs[name] = {
        kind: meta.kind,
        temperature: meta.temperature,
        calibration_tokens: meta.calibration.tokens,
        quality,
        speed,
      };
    }
  } finally {
    for (const m of models.values()) m.native.free();
  }
  return {
    note:
      "quality: stored eval-migration results (P=192, C=64, valid.txt); speed: pseudo-random prompts, warm source cache, full and migrated runs interleaved, medians of 5; linear kind migrates sequence → sequence natively, js_block_path is the same projector through f32 blocks in JS (r=8)",
    pairs,
  };
}

/**
 * Ablation of RoPE handling for fast→powerful (not run by benchMigration; ~1 min): the same
 * ridge fit (16k train.txt tokens, all source layers, λ 1e-5) with keys (a) de-rotated and
 * re-rotated (kvrelay), (b) mapped post-RoPE with no RoPE handling, (c) de-rotated but written
 * without the target's rotation; quality on 16 windows of valid.txt (P=192, C=64, r=8). RoPE is
 * disabled in a transform by giving it a linear scaling factor of 1e30 (all angles ≈ 0).
 * @returns per variant: recovered, kl_recovered, top-1 agreement
 */
export async function benchRopeAblation(): Promise<object> {
  const root = new URL("../", import.meta.url).pathname;
  const s = await loadModel(`${root}models/tiny-fast`),
    t = await loadModel(`${root}models/tiny-powerful`);
  try {
    const noRope = (c: ModelConfig): ModelConfig => ({
      ...c,
      ropeScaling: { type: "linear", factor: 1e30 },
    });
    const ids = await readCorpusTokens([`${root}../shared/corpus/train.txt`], 16384, s.tokenizer);
    const valid = await Deno.readTextFile(`${root}../shared/corpus/valid.txt`);
    const evalIds = s.tokenizer.encode(valid.slice(0, 200000));
    const meta = await readProjectorMeta(`${root}models/projectors/tiny-fast--tiny-powerful`);
    const sc = s.native.config, tc = t.native.config, ns = featureWidth(sc), nt = featureWidth(tc);
    const variants: [string, ModelConfig, ModelConfig, ModelConfig, ModelConfig][] = [
      ["derotate_rerotate", sc, tc, sc, tc],
      ["no_rope_handling", noRope(sc), noRope(tc), noRope(sc), noRope(tc)],
      ["skip_rerotation", sc, tc, sc, noRope(tc)],
    ];
    const out: Record<string, unknown> = {};
    for (const [name, srcIn, tgtIn, srcOut, tgtOut] of variants) {
      using ak = new RidgeAccumulator(ns, nt);
      using av = new RidgeAccumulator(ns, nt);
      {
        using ss = s.native.createSequence(256);
        using ts = t.native.createSequence(256);
        for (let w = 0; w < 64; w++) {
          const win = ids.slice(w * 256, w * 256 + 256);
          ss.truncate(0);
          await ss.prefill(win);
          ts.truncate(0);
          await ts.prefill(win);
          const bs = readCacheBlock(ss, 0, 256), bt = readCacheBlock(ts, 0, 256);
          const x = kvToFeatures(srcIn, 0, 256, bs.k, bs.v),
            y = kvToFeatures(tgtIn, 0, 256, bt.k, bt.v);
          await ak.accumulate(x.k, y.k, 256);
          await av.accumulate(x.v, y.v, 256);
        }
      }
      const all = Array.from({ length: ns }, (_, i) => i);
      const k = ak.solve(all, 0, nt, 1e-5), v = av.solve(all, 0, nt, 1e-5);
      using kern = new LinearKernel(
        srcOut,
        tgtOut,
        Float32Array.from(k.w),
        Float32Array.from(k.bias),
        Float32Array.from(v.w),
        Float32Array.from(v.bias),
      );
      const proj: Projector = {
        dir: "",
        meta,
        project: (p, b) => kern.apply(p, b),
        free: () => Promise.resolve(),
      };
      const ev = await evaluateMigration(s, t, proj, evalIds, {
        prefix: 192,
        continuation: 64,
        repairs: [8],
        maxWindows: 16,
      });
      const m = ev.repair["8"];
      out[name] = {
        recovered: m.recovered,
        kl_recovered: m.kl_recovered,
        top1_agreement: m.top1_agreement,
        no_prefix_top1_agreement: ev.no_prefix_top1_agreement,
      };
    }
    return out;
  } finally {
    s.native.free();
    t.native.free();
  }
}

/**
 * Per-stage times of migrating 2040 tokens (a 2048-token prompt, r = 8) fast→powerful with the
 * committed projector (not run by benchMigration; ~20 s): the JS block path (readCacheBlock:
 * kv_read per layer; apply: de-rotate → GEMM → re-rotate into new JS blocks; writeCacheBlock:
 * kv_write per layer) next to the native sequence → sequence call, and the projection GEMMs alone
 * (kvr_gemm_bench on a pre-packed weight, ×2 for K and V). Runs interleaved, medians of 9.
 * @param threads worker threads for both paths and the GEMM (0 = all cores)
 * @returns stage name → median ms
 */
export async function benchMigrationProfile(threads = 0): Promise<object> {
  const root = new URL("../", import.meta.url).pathname;
  const s = await loadModel(`${root}models/tiny-fast`),
    t = await loadModel(`${root}models/tiny-powerful`);
  const proj = await loadProjector(
    `${root}models/projectors/tiny-fast--tiny-powerful`,
    endpointOf(s),
    endpointOf(t),
  );
  try {
    const n = 2048, count = n - 8;
    using src = s.native.createSequence(n);
    await src.prefill(promptIds(n, t.native.config.vocabSize));
    const times: Record<string, number[]> = {};
    const rec = (k: string, v: number) => (times[k] ??= []).push(v);
    for (let i = 0; i < 9; i++) {
      {
        using dst = t.native.createSequence(n);
        const t0 = performance.now();
        const block = readCacheBlock(src, 0, count);
        const t1 = performance.now();
        const out = await proj.project(0, block, threads);
        const t2 = performance.now();
        writeCacheBlock(dst, 0, out);
        const t3 = performance.now();
        rec("js_read_cache_block", t1 - t0);
        rec("js_apply", t2 - t1);
        rec("js_write_cache_block", t3 - t2);
        rec("js_total", t3 - t0);
      }
      {
        using dst = t.native.createSequence(n);
        const t0 = performance.now();
        await proj.projectInto!(src, dst, count, threads);
        rec("native_seq_to_seq_total", performance.now() - t0);
      }
    }
    const ns = featureWidth(s.native.config), nt = featureWidth(t.native.config);
    rec("gemm_k_and_v_alone", 2000 * gemmBench(count, nt, ns, threads, 9));
    return {
      note: `fast→powerful, ${count} tokens, threads ${threads || "all"}, medians of 9 (ms)`,
      ...Object.fromEntries(Object.entries(times).map(([k, v]) => [k, median(v)])),
    };
  } finally {
    await proj.free();
    s.native.free();
    t.native.free();
  }
}

if (import.meta.main) {
  const result = Deno.args.includes("--ablation")
    ? await benchRopeAblation()
    : Deno.args.includes("--profile")
    ? await benchMigrationProfile()
    : await benchMigration();
  console.log(JSON.stringify(result, null, 2));
}

/** One projector pair of benchMigration()'s result (also read by result_rows.ts). */
export interface PairRow {
  kind: string;
  quality: {
    repair: Record<string, { recovered: number; kl_recovered: number; top1_agreement: number }>;
  } | null;
  speed: {
    prompt_tokens: number;
    full_ttft_ms: number;
    repair: Record<string, { ttft_ms: number; speedup: number }>;
    js_block_path?: { ttft_ms: number; speedup: number } | null;
  }[];
}

/**
 * Formats the migration section: one row per pair and repair length with stored quality and the
 * TTFT of full prefill vs migrate+repair at each prompt length.
 * @param result What benchMigration() returned.
 * @returns Printable table lines.
 */
export function formatMigrationTable(result: object): string {
  const pairs = (result as { pairs: Record<string, PairRow> }).pairs;
  const lines = [
    "pair                           kind    r  recovered  kl_rec  top1   | TTFT full→migrated ms (speedup) at 512 / 2048",
  ];
  for (const [name, row] of Object.entries(pairs)) {
    for (const r of REPAIRS) {
      const q = row.quality?.repair[String(r)];
      const speed = row.speed.map((s) =>
        `${s.full_ttft_ms.toFixed(0)}→${s.repair[String(r)].ttft_ms.toFixed(1)} (${
          s.repair[String(r)].speedup.toFixed(1)
        }×)`
      ).join(" / ");
      lines.push(
        `${name.padEnd(30)} ${row.kind.padEnd(6)} ${String(r).padStart(2)}  ${
          q ? q.recovered.toFixed(3).padStart(9) : "        -"
        }  ${q ? q.kl_recovered.toFixed(3) : "    -"}  ${
          q ? q.top1_agreement.toFixed(3) : "    -"
        }  | ${speed}`,
      );
    }
    if (row.speed.every((s) => s.js_block_path)) {
      const speed = row.speed.map((s) =>
        `${s.full_ttft_ms.toFixed(0)}→${s.js_block_path!.ttft_ms.toFixed(1)} (${
          s.js_block_path!.speedup.toFixed(1)
        }×)`
      ).join(" / ");
      lines.push(`${"".padEnd(30)} (JS block path, r=8)                   | ${speed}`);
    }
  }
  return lines.join("\n");
}
