// `deno task bench [section...]`: runs benchmark sections (default: all), prints their tables and
// writes bench/results/<section>-<date>.json with the machine they ran on.
import { benchEngine, formatEngineTable } from "./engine.ts";
import { benchSnapshots, formatSnapshotTable } from "./snapshot.ts";
import { benchHttp, formatHttpTable } from "./http.ts";
import { benchMigration, formatMigrationTable } from "./migration.ts";
import { benchBatch, formatBatchTable } from "./batch.ts";
import { benchColdStart, formatColdStartTable } from "./coldstart.ts";
import { machineInfo } from "./machine.ts";
import { benchMultihost, formatMultihostTable } from "./multihost.ts";

const root = new URL("../", import.meta.url).pathname;
const demoModels = ["tiny-fast", "tiny-balanced", "tiny-powerful"].map((m) => `${root}models/${m}`);

interface Section {
  run: () => Promise<object>;
  format: (result: never) => string;
}

const sections: Record<string, Section> = {
  engine: { run: () => benchEngine(demoModels), format: formatEngineTable },
  snapshot: { run: benchSnapshots, format: formatSnapshotTable },
  migration: { run: benchMigration, format: formatMigrationTable },
  http: { run: benchHttp, format: formatHttpTable },
  batch: { run: benchBatch, format: formatBatchTable },
  coldstart: { run: benchColdStart, format: formatColdStartTable },
  multihost: { run: benchMultihost, format: formatMultihostTable },
};

const wanted = Deno.args.length ? Deno.args : Object.keys(sections);
for (const name of wanted) {
  if (!(name in sections)) {
    console.error(`unknown section "${name}"; sections: ${Object.keys(sections).join(", ")}`);
    Deno.exit(2);
  }
}

const machine = await machineInfo();
const day = machine.date.slice(0, 10);
console.log(`machine: ${machine.cpuModel}, ${machine.logicalCpus} CPUs @ ${machine.cpuMhz} MHz`);
for (const name of wanted) {
  const section = sections[name];
  console.log(`\n== ${name}`);
  const result = await section.run();
  console.log(section.format(result as never));
  const path = `${root}bench/results/${name}-${day}.json`;
  await Deno.writeTextFile(path, JSON.stringify({ machine, ...result }, null, 2) + "\n");
  console.log(`wrote ${path}`);
}
