// `deno task bench [section...] [--real | --shapes=a,b] [--models=tiny-fast,..] [--formats=bf16,..]
// [--columns=prefill128,..] [--runs=N] [--threads=N] [--kvrelay-kv=f16]`: runs benchmark sections
// (default: all but peers), prints their tables and overwrites bench/results/<section>.json with
// the machine, the commit and the figures (result_file.ts; `deno task results` tabulates them in
// bench/RESULTS.md). --real (or --shapes) adds the random-weight real-size shapes
// (scripts/make_checkpoint.ts; generated on first use) to the engine and peers sections; --models
// picks demo models; --formats, --columns, --runs and --threads apply to peers (rounds, default 7;
// threads, default 2); --kvrelay-kv sets kvrelay's KV cache dtype in peers (default f32; f16 is
// llama.cpp's default).
import { parseArgs } from "node:util";
import type { KvDtype } from "../lib/native/mod.ts";
import { benchEngine, formatEngineTable } from "./engine.ts";
import { benchSnapshots, formatSnapshotTable } from "./snapshot.ts";
import { benchHttp, formatHttpTable } from "./http.ts";
import { benchServeLoad, formatServeLoadTable } from "./serve_load.ts";
import { benchMigration, formatMigrationTable } from "./migration.ts";
import { benchPeers, type Column, COLUMNS, formatPeersTable } from "./peers.ts";
import { benchBatch, formatBatchTable } from "./batch.ts";
import { benchColdStart, formatColdStartTable } from "./coldstart.ts";
import { benchGrammar, formatGrammarTable } from "./grammar.ts";
import { machineInfo } from "./machine.ts";
import { currentCommit, sectionResult } from "./result_file.ts";
import { SECTION_ROWS } from "./result_rows.ts";
import { benchMultihost, formatMultihostTable } from "./multihost.ts";
import { ensureShapeCheckpoint } from "../scripts/make_checkpoint.ts";
import { REAL_SHAPES } from "../tests/fixtures/real_shapes.ts";

const root = new URL("../", import.meta.url).pathname;
const DEMO = ["tiny-fast", "tiny-balanced", "tiny-powerful"];

const USAGE = `usage: deno task bench [section...] [options]   (deno task bench list: the sections)

Runs benchmark sections (default: all but peers), prints their tables and writes
bench/results/<section>.json (the latest result of each section) with the machine they ran on.
  --real              add the random-weight real-size shapes (engine, peers)
  --shapes=a,b        those shapes only (qwen3-0.6b, llama-3.2-1b)
  --models=a,b        demo models (tiny-fast, tiny-balanced, tiny-powerful, or none)
  --formats=a,b       peers: weight formats (bf16, q8, q4)
  --columns=a,b       peers: columns (prefill128, ...)
  --runs=N            peers: rounds (default 7)
  --threads=N         peers: threads (default 2)
  --kvrelay-kv=DTYPE  peers: kvrelay's KV cache dtype (f32, f16, bf16)`;

/** One line per section, for `bench list`. */
const SECTION_HELP: Record<string, string> = {
  engine: "prefill and decode throughput of the native engine per model",
  snapshot: "KV snapshot encode/decode speed and size per encoding",
  migration: "cross-model KV projection time and quality",
  http: "HTTP latency and throughput of a served tier",
  serve: "the README server as a client sees it: 256-token completions, 1 vs 32 at once",
  batch: "continuous batching: step times and per-request TPOT at several concurrencies",
  coldstart: "process start until /readyz, and where the time went",
  multihost: "snapshot handoff between namespaced hosts",
  grammar: "structured output: schema compile, bitmask per token, constrained vs free decode",
  peers: "kvrelay beside llama.cpp on the same weights (only when named; minutes)",
};

function parseFlags() {
  try {
    return parseArgs({
      args: Deno.args,
      allowPositionals: true,
      options: {
        help: { type: "boolean", short: "h" },
        real: { type: "boolean" },
        shapes: { type: "string" },
        runs: { type: "string" },
        threads: { type: "string" },
        models: { type: "string" },
        formats: { type: "string" },
        columns: { type: "string" },
        "kvrelay-kv": { type: "string" },
      },
    });
  } catch (e) {
    console.error(
      `bench: ${
        (e as Error).message.split("\n")[0].replace(/\. To specify.*/, "")
      } (deno task bench --help)`,
    );
    Deno.exit(2);
  }
}
const { values: flags, positionals } = parseFlags();
if (flags.help) {
  console.log(USAGE);
  Deno.exit(0);
}
if (positionals.length === 1 && positionals[0] === "list") {
  for (const [name, what] of Object.entries(SECTION_HELP)) {
    console.log(`${name.padEnd(10)} ${what}`);
  }
  Deno.exit(0);
}
const shapeNames = flags.real
  ? Object.keys(REAL_SHAPES)
  : (flags.shapes ? flags.shapes.split(",").filter(Boolean) : []);
for (const s of shapeNames) {
  if (!(s in REAL_SHAPES)) {
    console.error(`unknown shape "${s}"; shapes: ${Object.keys(REAL_SHAPES).join(", ")}`);
    Deno.exit(2);
  }
}
const positiveInt = (name: string, v: string | undefined, dflt: number) => {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) {
    console.error(`--${name} must be a positive integer, got "${v}"`);
    Deno.exit(2);
  }
  return n;
};
const runs = positiveInt("runs", flags.runs, 7);
const demoNames = flags.models === undefined
  ? DEMO
  : flags.models.split(",").filter((m) => m && m !== "none");
for (const m of demoNames) {
  if (!DEMO.includes(m)) {
    console.error(`unknown demo model "${m}"; models: ${DEMO.join(", ")} (or none)`);
    Deno.exit(2);
  }
}
const demoModels = demoNames.map((m) => `${root}models/${m}`);
const formats = flags.formats?.split(",").filter(Boolean);
const threads = positiveInt("threads", flags.threads, 2);
const columns = flags.columns?.split(",").filter(Boolean);
for (const c of columns ?? []) {
  if (!(COLUMNS as readonly string[]).includes(c)) {
    console.error(`unknown column "${c}"; columns: ${COLUMNS.join(", ")}`);
    Deno.exit(2);
  }
}
const kvrelayKv = flags["kvrelay-kv"];
if (kvrelayKv !== undefined && !["f32", "f16", "bf16"].includes(kvrelayKv)) {
  console.error(`--kvrelay-kv must be f32, f16 or bf16, got "${kvrelayKv}"`);
  Deno.exit(2);
}

/** Generated real-size checkpoint directories asked for (written on first use). */
async function realModels(): Promise<string[]> {
  const dirs = [];
  for (const s of shapeNames) dirs.push(await ensureShapeCheckpoint(s, { log: console.error }));
  return dirs;
}

interface Section {
  run: () => Promise<object>;
  format: (result: never) => string;
}

const sections: Record<string, Section> = {
  engine: {
    run: async () => benchEngine([...demoModels, ...await realModels()]),
    format: formatEngineTable,
  },
  snapshot: { run: benchSnapshots, format: formatSnapshotTable },
  migration: { run: benchMigration, format: formatMigrationTable },
  http: { run: benchHttp, format: formatHttpTable },
  serve: { run: benchServeLoad, format: formatServeLoadTable },
  batch: { run: benchBatch, format: formatBatchTable },
  coldstart: { run: benchColdStart, format: formatColdStartTable },
  multihost: { run: benchMultihost, format: formatMultihostTable },
  grammar: { run: benchGrammar, format: formatGrammarTable },
  peers: {
    run: async () =>
      benchPeers({
        models: [
          ...demoModels.map((dir) => ({ dir, realSize: false })),
          ...(await realModels()).map((dir) => ({ dir, realSize: true })),
        ],
        threads,
        runs,
        realRuns: Math.min(runs, 3),
        formats,
        columns: columns as Column[] | undefined,
        kvrelayKv: kvrelayKv as KvDtype | undefined,
      }),
    format: formatPeersTable,
  },
};
// peers needs the llama.cpp npm package and minutes: only when named
const defaults = Object.keys(sections).filter((s) => s !== "peers");

const wanted = positionals.length ? positionals : defaults;
for (const name of wanted) {
  if (!(name in sections)) {
    console.error(
      `bench: unknown section "${name}"; sections: ${Object.keys(sections).join(", ")} ` +
        "(deno task bench list)",
    );
    Deno.exit(2);
  }
}

const machine = await machineInfo();
const commit = await currentCommit(root);
const command = ["deno task bench", ...Deno.args].join(" ");
console.log(`machine: ${machine.cpuModel}, ${machine.logicalCpus} CPUs @ ${machine.cpuMhz} MHz`);
for (const name of wanted) {
  const section = sections[name];
  console.log(`\n== ${name}`);
  const result = await section.run();
  console.log(section.format(result as never));
  const rows = SECTION_ROWS[name](result as never);
  const path = `${root}bench/results/${name}.json`;
  const file = sectionResult(name, machine, commit, command, rows);
  await Deno.writeTextFile(path, JSON.stringify(file, null, 2) + "\n");
  console.log(`wrote ${path}`);
}
