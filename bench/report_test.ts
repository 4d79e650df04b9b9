// bench/report.ts against a small fixture whose figures are known: the table shows them with
// machine and commit, and each plot has one mark per measured pair or point.
import assert from "node:assert/strict";
import { parseSectionResult, row, type SectionResult } from "./result_file.ts";
import { writeReport } from "./report.ts";
import { SECTION_ROWS } from "./result_rows.ts";

const machine = { cpu: "Test CPU 9000", cores: 4, os: "linux-x86_64", deno: "2.9.6" };

function file(section: string, rows: SectionResult["rows"]): SectionResult {
  return {
    section,
    machine,
    commit: "abc1234",
    date: "2026-01-02T03:04:05.000Z",
    command: "test",
    rows,
  };
}

const peers = file("peers", [
  row({ model: "m1", weights: "bf16", engine: "kvrelay" }, "prefill128", "tokens/s", [
    90,
    100,
    130,
  ]),
  row(
    { model: "m1", weights: "bf16", engine: "llama.cpp (fa=on,kv=f16)" },
    "prefill128",
    "tokens/s",
    50,
  ),
  row({ model: "m1", weights: "q8", engine: "kvrelay" }, "decode@512", "tokens/s", 40),
  row(
    { model: "m1", weights: "q8", engine: "llama.cpp (fa=off,kv=f16)" },
    "decode@512",
    "tokens/s",
    80,
  ),
  // llama.cpp only (kvrelay does not run this format): no bar
  row(
    { model: "m1", weights: "q4", engine: "llama.cpp (fa=off,kv=f16)" },
    "decode@512",
    "tokens/s",
    70,
  ),
]);
const batch = file("batch", [
  row({ model: "m1", mode: "alone", concurrency: 1 }, "decode", "tokens/s", 1000),
  row({ model: "m1", mode: "batched", concurrency: 1 }, "decode", "tokens/s", 900),
  row({ model: "m1", mode: "batched", concurrency: 32 }, "decode", "tokens/s", 2700),
]);
const http = file("http", [
  row({ tier: "fast", concurrency: 1 }, "aggregate", "tokens/s", 500),
  row({ tier: "fast", concurrency: 8 }, "aggregate", "tokens/s", 1500),
  row({ tier: "fast", concurrency: 32 }, "aggregate", "tokens/s", 2000),
  row({ tier: "fast", concurrency: 1 }, "TTFT p50", "ms", 8.25),
]);

async function report(files: SectionResult[]) {
  const dir = await Deno.makeTempDir();
  await Deno.mkdir(`${dir}/results`);
  for (const f of files) {
    await Deno.writeTextFile(`${dir}/results/${f.section}.json`, JSON.stringify(f));
  }
  await writeReport(`${dir}/results`, dir);
  return dir;
}

Deno.test("RESULTS.md shows each section's machine, commit, medians and spread", async () => {
  const dir = await report([peers, batch, http]);
  const md = await Deno.readTextFile(`${dir}/RESULTS.md`);
  assert.ok(
    md.indexOf("## peers") < md.indexOf("## batch") &&
      md.indexOf("## batch") < md.indexOf("## http"),
  );
  assert.deepEqual(md.match(/Machine: Test CPU 9000, 4 logical CPUs/g)?.length, 3);
  assert.deepEqual(md.match(/Commit `abc1234`, 2026-01-02/g)?.length, 3);
  // kvrelay prefill128: three runs, median 100, spread 90–130
  assert.match(md, /\| m1 \| bf16 \| kvrelay \| prefill128 \(tokens\/s\) \| 100 \| 90–130 \| 3 \|/);
  // a median-only figure: no spread, no run count
  assert.match(md, /\| fast \| 1 \| TTFT p50 \(ms\) \| 8\.25 \| — \| — \|/);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("the peer plot has one bar per model/weights/column both engines ran, the batching plot one point per measurement", async () => {
  const dir = await report([peers, batch, http]);
  const peersSvg = await Deno.readTextFile(`${dir}/plots/peers.svg`);
  assert.deepEqual(peersSvg.match(/class="bar"/g)?.length, 2);
  assert.match(peersSvg, />2×</); // 100 / 50
  assert.match(peersSvg, />0\.5×</); // 40 / 80
  const batching = await Deno.readTextFile(`${dir}/plots/batching.svg`);
  // batched c=1 and c=32 of m1 (the alone run is not on the curve), three HTTP concurrencies
  assert.deepEqual(batching.match(/class="point"/g)?.length, 5);
  assert.deepEqual(batching.match(/<polyline/g)?.length, 2);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("a result file not in the one shape is refused with its name", async () => {
  const dir = await Deno.makeTempDir();
  await Deno.writeTextFile(
    `${dir}/engine.json`,
    JSON.stringify({ machine: { cpuModel: "x" }, models: [] }),
  );
  await assert.rejects(
    () => writeReport(dir, dir),
    (e) => e instanceof TypeError && /engine\.json/.test(e.message),
  );
  await Deno.remove(dir, { recursive: true });
});

Deno.test("peers rows: kvrelay's rounds give median and spread, llama.cpp's best keeps its configuration", () => {
  const rows = SECTION_ROWS.peers({
    models: [{
      model: "m1",
      formats: [{
        format: "bf16",
        kvrelay: { prefill128: 100 },
        llamaBest: { prefill128: { tokensPerSecond: 50, config: "fa=on,kv=f16" } },
        rounds: { prefill128: { kvrelay: [130, 90, 100], llamaBest: [50, 40, 60] } },
      }],
    }],
  } as never);
  assert.deepEqual(rows.length, 2);
  assert.deepEqual([rows[0].median, rows[0].min, rows[0].max, rows[0].runs], [100, 90, 130, 3]);
  assert.deepEqual(rows[1].labels.engine, "llama.cpp (fa=on,kv=f16)");
  assert.deepEqual([rows[1].median, rows[1].min, rows[1].max], [50, 40, 60]);
});

Deno.test("engine rows: each run's tokens/s gives the median and spread; older results without runs keep their median", () => {
  const model = {
    model: "m1",
    threads: 2,
    weights: "bf16",
    prefillTokensPerSecond: { "128": 110 },
    decodeTokensPerSecond: 50,
    decodeContext: 512,
  };
  const withRuns = SECTION_ROWS.engine({
    models: [{ ...model, runs: { prefill: { "128": [100, 120, 110] }, decode: [40, 50, 60] } }],
    quantKernels: [],
    gemm: [],
  } as never);
  assert.deepEqual(
    withRuns.map((r) => [r.metric, r.median, r.min, r.max, r.runs]),
    [["prefill128", 110, 100, 120, 3], ["decode@512", 50, 40, 60, 3]],
  );
  const old = SECTION_ROWS.engine({ models: [model], quantKernels: [], gemm: [] } as never);
  assert.deepEqual(old.map((r) => [r.median, r.min, r.runs]), [[110, null, null], [
    50,
    null,
    null,
  ]]);
});

Deno.test("every committed file in bench/results is in the one shape and names its own section", async () => {
  const dir = new URL("./results/", import.meta.url);
  let files = 0;
  for await (const e of Deno.readDir(dir)) {
    if (!e.name.endsWith(".json")) continue;
    const r = parseSectionResult(JSON.parse(await Deno.readTextFile(new URL(e.name, dir))), e.name);
    assert.equal(`${r.section}.json`, e.name);
    files++;
  }
  assert.ok(files > 0);
});
