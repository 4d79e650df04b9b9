// `eval-migration`: measure a projector on a text file (docs/migration.md): full target prefill vs
// migrated prefix + repair r vs no prefix, in windows of P+C tokens. Progress on stderr; the last
// stdout line is one JSON object. Without --projector, source and target must be the same model.

import {
  evaluateMigration,
  parseProjectorMeta,
  qualityRecord,
  readProjectorMeta,
} from "../migrate/mod.ts";
import {
  type CliCommand,
  migrationOptions,
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
import { WEIGHT_FORMATS, type WeightFormat } from "../native/mod.ts";
import { loadMigrationPair } from "./model_pair.ts";
import { progressBar } from "./progress.ts";

const usage =
  `usage: deno task cli eval-migration --source DIR --target DIR --projector DIR --file TEXT
       --prefix P --continuation C --repair R[,R...] [--json] [--max-windows N]

The file is tokenized as one sequence and cut into consecutive non-overlapping windows w of P+C
tokens. Scored tokens are w[P+1..P+C-1]: (a) full: the target prefills w[0..P+C-2]; (b) migrated,
repair r: positions 0..P-r-1 come from the projected source cache, the target computes the rest;
(c) no prefix: the target sees w[P..P+C-2] from position 0. recovered = (nll_c - nll_b)/(nll_c -
nll_a); kl_recovered = 1 - kl_b/kl_c. When the projector stores a temperature, metrics at that
temperature are reported under "temperature". The last line printed is one JSON object.

  --source DIR        source checkpoint          --target DIR   target checkpoint
  --projector DIR     projector directory (omit only when source and target are the same model)
  --file PATH         UTF-8 text
  --prefix P          prompt tokens per window (demo models: P+C <= 256)
  --continuation C    continuation tokens per window
  --repair R,...      repair lengths (1 <= r < P)
  --max-windows N     evaluate at most N windows
  --json              print only the JSON line
  --store             also store the result as the projector's measured quality (projector.json)
  --target-weights W  the target's weights only (bf16 | q8 | q4; default: --weights, which applies
                      to both models): migration into a quantized tier
  --threads N  --kv-dtype D  --weights W  --backend B  --device N`;

/** The `eval-migration` command. */
export const evalMigrationCommand: CliCommand = {
  summary: "measure migration quality: full vs migrated+repair vs no prefix",
  usage,
  async run(args) {
    const v = parseOptions(args, {
      ...migrationOptions,
      file: { type: "string" },
      prefix: { type: "string" },
      continuation: { type: "string" },
      repair: { type: "string" },
      "max-windows": { type: "string" },
      json: { type: "boolean" },
      store: { type: "boolean" },
      "target-weights": { type: "string" },
    });
    if (v.help) return await printUsage(usage);
    const dirs = parsePairOptions(v);
    const file = requireString(v.file, "file");
    const prefix = parseNumber(requireString(v.prefix, "prefix"), "prefix", "int")!;
    const continuation = parseNumber(
      requireString(v.continuation, "continuation"),
      "continuation",
      "int",
    )!;
    if (prefix < 2 || continuation < 2) {
      throw new UsageError(
        `--prefix and --continuation must be >= 2, got ${prefix}, ${continuation}`,
      );
    }
    const repairs = parseRepairList(requireString(v.repair, "repair"), "repair");
    for (const r of repairs) {
      if (r >= prefix) throw new UsageError(`--repair ${r} must be < --prefix ${prefix}`);
    }
    const maxWindows = parseNumber(v["max-windows"], "max-windows", "int");
    const text = await Deno.readTextFile(file);
    const native = parseModelLoadOptions(v);
    const targetWeights = v["target-weights"];
    if (
      targetWeights !== undefined && !(WEIGHT_FORMATS as readonly unknown[]).includes(targetWeights)
    ) {
      throw new UsageError(
        `--target-weights must be ${WEIGHT_FORMATS.join(", ")}, got ${
          JSON.stringify(targetWeights)
        }`,
      );
    }
    if (targetWeights !== undefined && v.store) {
      throw new UsageError("--store records the projector's quality: not with --target-weights");
    }
    const targetNative = targetWeights === undefined
      ? native
      : { ...native, weights: targetWeights as WeightFormat };
    await using pair = await loadMigrationPair(dirs, native, targetNative);
    const { source, target, projector } = pair;
    const ids = source.tokenizer.encode(text, { addSpecialTokens: false });
    const bar = progressBar(`eval ${source.name}→${target.name}`);
    const r = await evaluateMigration(source, target, projector, ids, {
      prefix,
      continuation,
      repairs,
      maxWindows,
      temperature: projector?.meta.temperature ?? null,
      onProgress: (d, t) => bar("windows", d, t),
    });
    if (!v.json) {
      const lines = [
        `windows ${r.windows}  full_nll ${r.full_nll.toFixed(4)}  no_prefix_nll ${
          r.no_prefix_nll.toFixed(4)
        }  source_nll ${r.source_nll.toFixed(4)}  full_ttft ${r.full_ttft_ms.toFixed(2)} ms`,
        ...Object.entries(r.repair).map(([k, m]) =>
          `repair ${k}: nll ${m.nll.toFixed(4)}  recovered ${
            m.recovered.toFixed(3)
          }  kl_recovered ${m.kl_recovered.toFixed(3)}  top1 ${m.top1_agreement.toFixed(3)}  ttft ${
            m.ttft_ms.toFixed(2)
          } ms`
        ),
      ];
      await writeStdout(lines.join("\n") + "\n");
    }
    if (v.store) {
      if (projector === null) throw new UsageError("--store needs --projector");
      const meta = await readProjectorMeta(projector.dir);
      meta.quality = qualityRecord(r, file.split("/").slice(-2).join("/"), prefix, continuation);
      parseProjectorMeta(meta, `${projector.dir}/projector.json`);
      await Deno.writeTextFile(
        `${projector.dir}/projector.json`,
        JSON.stringify(meta, null, 2) + "\n",
      );
    }
    await writeStdout(JSON.stringify(r) + "\n");
    return 0;
  },
};
