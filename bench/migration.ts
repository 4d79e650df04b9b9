// Migration benchmark (issue 4): per committed demo projector, the stored quality at P=192, C=64
// on valid.txt (recovered, kl_recovered, top-1 for r ∈ {1, 8, 32}); and per pair and prompt
// length 512/2048 (beyond the demo models' trained context: time only) the TTFT of full target
// prefill vs migrate+repair(r) from a warm source cache, medians, with the migration split out.
// `--ablation` runs benchRopeAblation instead (RoPE handling variants of the linear map).
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
import type { ModelConfig } from "../lib/model/mod.ts";
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
    for (let i = 0; i < RUNS; i++) {
      {
        using seq = target.native.createSequence(n);
        const t0 = performance.now();
        await seq.prefill(ids);
        full.push(performance.now() - t0);
      }
      for (const r of REPAIRS) {
        using dst = target.native.createSequence(n);
        const t0 = performance.now();
        const m = await migrateAndRepair({
          source: endpointOf(source),
          sourceSeq: src,
          target: endpointOf(target),
          targetSeq: dst,
          projector: proj,
          prompt: ids,
          repair: r,
        });
        const x = runs.get(r)!;
        x.ttft.push(performance.now() - t0);
        x.mig.push(m.migrateMs);
        x.rep.push(m.repairMs);
      }
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
    return { prompt_tokens: n, full_ttft_ms: fullMs, source_prefill_ms: sourceMs, repair };
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
      "quality: stored eval-migration results (P=192, C=64, valid.txt); speed: pseudo-random prompts, warm source cache, full and migrated runs interleaved, medians of 5",
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

if (import.meta.main) {
  const result = Deno.args.includes("--ablation")
    ? await benchRopeAblation()
    : await benchMigration();
  console.log(JSON.stringify(result, null, 2));
}

interface PairRow {
  kind: string;
  quality: {
    repair: Record<string, { recovered: number; kl_recovered: number; top1_agreement: number }>;
  } | null;
  speed: {
    prompt_tokens: number;
    full_ttft_ms: number;
    repair: Record<string, { ttft_ms: number; speedup: number }>;
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
  }
  return lines.join("\n");
}
