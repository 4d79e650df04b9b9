// `fit`: fit a linear KV projector source → target on calibration text and write the artifact
// (projector.json + weights.safetensors), optionally measuring its quality on an evaluation file
// first. Progress bar with ETA on stderr; the last stdout line is one JSON summary.

import {
  endpointOf,
  evaluateMigration,
  fitLinearProjector,
  loadProjector,
  qualityRecord,
  writeProjector,
} from "../migrate/mod.ts";
import { readCorpusTokens } from "../migrate/corpus.ts";
import {
  BACKEND_USAGE,
  type CliCommand,
  pairOptions,
  parseModelLoadOptions,
  parseNumber,
  parseOptions,
  parsePairOptions,
  parseRepairList,
  printUsage,
  requireString,
  UsageError,
  writeStdout,
} from "./command.ts";
import { loadModelPair } from "./model_pair.ts";
import { progressBar } from "./progress.ts";

const usage =
  `usage: deno task cli fit --source DIR --target DIR --corpus FILE... --out DIR [options]

Runs both models over consecutive calibration windows of the corpus, strips RoPE from keys,
accumulates float64 XᵀX / XᵀY natively (train split, then a held-out split after it), chooses
source layers and λ per target layer on the held-out split, solves by Cholesky, fits a
temperature on held-out windows and writes OUT/projector.json + OUT/weights.safetensors.

  --source DIR           source checkpoint (its cache is migrated)
  --target DIR           target checkpoint (same tokenizer)
  --corpus FILE...       calibration text file(s), concatenated (repeatable)
  --out DIR              projector directory to write
  --tokens N             training tokens (default 65536)
  --heldout-tokens N     held-out tokens after the training ones (default N/4)
  --window N             calibration window length (default 256)
  --lambda auto|X        relative ridge strength, or auto = grid search on held-out (default auto)
  --source-layers auto|all|K   source layers per target layer (default auto)
  --repair-default R     repair length stored as the default (default 8)
  --eval-file FILE       measure quality on FILE and store it (default: none)
  --eval-prefix P        (default 192)   --eval-continuation C (default 64)
  --eval-repair R,...    repair lengths measured (default 1,8,32)
  --eval-windows N       at most N evaluation windows (default all)
  --threads N            CPU threads (default all cores)
  --kv-dtype D           KV cache type f32 | f16 | bf16 (default f32)
${BACKEND_USAGE}`;

/** `--corpus a b --x` → `--corpus a --corpus b --x` (FILE... after one flag). */
function expandCorpus(args: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    out.push(args[i]);
    if (args[i] === "--corpus") {
      let j = i + 1;
      if (j < args.length) out.push(args[j++]);
      while (j < args.length && !args[j].startsWith("--")) out.push("--corpus", args[j++]);
      i = j - 1;
    }
  }
  return out;
}

/** The `fit` command. */
export const fitCommand: CliCommand = {
  summary: "fit a linear KV projector between two models (writes projector.json + weights)",
  usage,
  async run(args) {
    const v = parseOptions(expandCorpus(args), {
      ...pairOptions,
      corpus: { type: "string", multiple: true },
      out: { type: "string" },
      tokens: { type: "string" },
      "heldout-tokens": { type: "string" },
      window: { type: "string" },
      lambda: { type: "string" },
      "source-layers": { type: "string" },
      "repair-default": { type: "string" },
      "eval-file": { type: "string" },
      "eval-prefix": { type: "string" },
      "eval-continuation": { type: "string" },
      "eval-repair": { type: "string" },
      "eval-windows": { type: "string" },
    });
    if (v.help) return await printUsage(usage);
    const dirs = parsePairOptions(v);
    const out = requireString(v.out, "out");
    const corpus = v.corpus ?? [];
    if (corpus.length === 0) throw new UsageError("--corpus is required");
    const tokens = parseNumber(v.tokens, "tokens", "int") ?? 65536;
    const window = parseNumber(v.window, "window", "int") ?? 256;
    const heldout = parseNumber(v["heldout-tokens"], "heldout-tokens", "int") ??
      Math.max(window, Math.floor(tokens / 4));
    if (tokens < window || heldout < window) {
      throw new UsageError(
        `--tokens ${tokens} and --heldout-tokens ${heldout} must be >= --window ${window}`,
      );
    }
    let lambda: "auto" | number = "auto";
    if (v.lambda !== undefined && v.lambda !== "auto") {
      lambda = parseNumber(v.lambda, "lambda", "float")!;
      if (lambda < 0) throw new UsageError(`--lambda must be auto or >= 0, got ${v.lambda}`);
    }
    let sourceLayers: "auto" | "all" | number = "auto";
    if (v["source-layers"] === "all") sourceLayers = "all";
    else if (v["source-layers"] !== undefined && v["source-layers"] !== "auto") {
      sourceLayers = parseNumber(v["source-layers"], "source-layers", "int")!;
      if (sourceLayers < 1) {
        throw new UsageError(
          `--source-layers must be auto, all or >= 1, got ${v["source-layers"]}`,
        );
      }
    }
    const repairDefault = parseNumber(v["repair-default"], "repair-default", "int") ?? 8;
    if (repairDefault < 1) {
      throw new UsageError(`--repair-default must be >= 1, got ${repairDefault}`);
    }
    const evalPrefix = parseNumber(v["eval-prefix"], "eval-prefix", "int") ?? 192;
    const evalCont = parseNumber(v["eval-continuation"], "eval-continuation", "int") ?? 64;
    const evalRepairs = parseRepairList(v["eval-repair"] ?? "1,8,32", "eval-repair");
    const evalWindows = parseNumber(v["eval-windows"], "eval-windows", "int");
    await using pair = await loadModelPair(dirs, parseModelLoadOptions(v));
    const { source, target } = pair;
    const bar = progressBar(`fit ${source.name}→${target.name}`);
    const ids = await readCorpusTokens(corpus, tokens + heldout, source.tokenizer);
    const fitted = await fitLinearProjector(source, target, ids, {
      tokens,
      heldoutTokens: heldout,
      windowTokens: window,
      lambda,
      sourceLayers,
      repairDefault,
      corpus: corpus.map((f) => f.split("/").slice(-2).join("/")),
      onProgress: bar,
    });
    await writeProjector(out, fitted.meta, fitted.layers);
    if (v["eval-file"] !== undefined) {
      const file = v["eval-file"];
      const evalIds = source.tokenizer.encode(await Deno.readTextFile(file), {
        addSpecialTokens: false,
      });
      const proj = await loadProjector(out, endpointOf(source), endpointOf(target));
      try {
        const ev = await evaluateMigration(source, target, proj, evalIds, {
          prefix: evalPrefix,
          continuation: evalCont,
          repairs: evalRepairs,
          maxWindows: evalWindows,
          temperature: fitted.meta.temperature,
          onProgress: (d, t) => bar("evaluation windows", d, t),
        });
        fitted.meta.quality = qualityRecord(
          ev,
          file.split("/").slice(-2).join("/"),
          evalPrefix,
          evalCont,
        );
      } finally {
        await proj.free();
      }
      await writeProjector(out, fitted.meta, fitted.layers);
    }
    const m = fitted.meta;
    await writeStdout(
      JSON.stringify({
        out,
        source: m.source.name,
        target: m.target.name,
        tokens: m.calibration.tokens,
        heldout_tokens: m.calibration.heldout_tokens,
        fit_seconds: m.calibration.fit_seconds,
        mean_heldout_r2: m.calibration.mean_heldout_r2,
        temperature: m.temperature,
        quality: m.quality,
      }) + "\n",
    );
    return 0;
  },
};
