// Keeps the GPU check from rotting on machines without a GPU: runs its driver
// (scripts/gpu_check/gpu_check.py) in dry-run mode, where the CPU backend stands in for CUDA,
// over its correctness section (demo models and generated checkpoints of every family and
// weight dtype vs the CPU backend and a float64 numpy reference, KV round trip, greedy
// agreement) plus the probe checks, its handoff section, and its batched-step section (batched vs
// alone, native sampling in the step, pool exhaustion, the batch-size sweep's code path). Needs
// python3 with numpy (.ci/run installs it).

import assert from "node:assert/strict";

const root = new URL("../../", import.meta.url).pathname;
const lib = Deno.env.get("KVRELAY_LIB") ?? `${root}build/native/libkvrelay.so`;

Deno.test("gpu_check.py --dry-run passes its correctness and probe checks on the CPU backend", async () => {
  const out = await Deno.makeTempDir({ prefix: "gpu_check_" });
  try {
    const { code, stdout, stderr } = await new Deno.Command("python3", {
      args: [
        `${root}scripts/gpu_check/gpu_check.py`,
        "--dry-run",
        "--quick",
        "--sections",
        "correctness",
        "--lib",
        lib,
        "--out",
        out,
      ],
      env: { OMP_WAIT_POLICY: "passive" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr);
    assert.equal(code, 0, text.slice(-4000));
    const m = text.match(/RESULT: (\d+) passed, (\d+) failed/);
    assert.ok(m, text.slice(-2000));
    assert.equal(Number(m[2]), 0, text.slice(-4000));
    const report = JSON.parse(await Deno.readTextFile(`${out}/gpu_check.json`));
    assert.equal(report.failed, 0);
    assert.equal(report.passed, Number(m[1]));
    // 3 demo models × 2 KV dtypes and 7 generated checkpoints, each with several checks.
    const models = new Set(
      report.checks.filter((c: { section: string }) => c.section === "correctness")
        .map((c: { name: string }) => c.name.split(" ")[0]),
    );
    assert.ok(models.size >= 13, `models checked: ${[...models].join(", ")}`);
    assert.ok(report.skipped.length === 0, JSON.stringify(report.skipped));
  } finally {
    await Deno.remove(out, { recursive: true });
  }
});

Deno.test("gpu_check.py --dry-run passes its handoff checks (golden-snapshot codec, projection, sampling, fit) on the CPU backend", async () => {
  const out = await Deno.makeTempDir({ prefix: "gpu_check_handoff_" });
  try {
    const { code, stdout, stderr } = await new Deno.Command("python3", {
      args: [
        `${root}scripts/gpu_check/gpu_check.py`,
        "--dry-run",
        "--quick",
        "--sections",
        "handoff",
        "--lib",
        lib,
        "--out",
        out,
      ],
      env: { OMP_WAIT_POLICY: "passive" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr);
    assert.equal(code, 0, text.slice(-4000));
    const report = JSON.parse(await Deno.readTextFile(`${out}/gpu_check.json`));
    assert.equal(report.failed, 0, text.slice(-4000));
    const names: string[] = report.checks
      .filter((c: { section: string }) => c.section === "handoff")
      .map((c: { name: string }) => c.name);
    // every golden file exported byte for byte and imported, plus the projection checks
    assert.equal(names.filter((n) => /byte-identical to the golden file/.test(n)).length, 7);
    assert.equal(names.filter((n) => /restores the CPU's KV/.test(n)).length, 7);
    assert.ok(names.some((n) => /KL\(full ‖ migrated\)/.test(n)), names.join("\n"));
    // decode_sample vs the reference sampler for every sampling configuration
    assert.equal(names.filter((n) => /device sampling vs the reference sampler/.test(n)).length, 5);
    // fit statistics (G, C, yy of keys and values) vs the CPU's
    assert.equal(names.filter((n) => /fit statistics vs CPU/.test(n)).length, 6);
  } finally {
    await Deno.remove(out, { recursive: true });
  }
});

Deno.test("gpu_check.py --dry-run passes its batched-step checks (batched vs alone, sampling in the step, pool exhaustion) on the CPU backend", async () => {
  const out = await Deno.makeTempDir({ prefix: "gpu_check_batch_" });
  try {
    const { code, stdout, stderr } = await new Deno.Command("python3", {
      args: [
        `${root}scripts/gpu_check/gpu_check.py`,
        "--dry-run",
        "--quick",
        "--sections",
        "batch",
        "--lib",
        lib,
        "--out",
        out,
      ],
      env: { OMP_WAIT_POLICY: "passive" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr);
    assert.equal(code, 0, text.slice(-4000));
    const report = JSON.parse(await Deno.readTextFile(`${out}/gpu_check.json`));
    assert.equal(report.failed, 0, text.slice(-4000));
    const names: string[] = report.checks
      .filter((c: { section: string }) => c.section === "batch")
      .map((c: { name: string }) => c.name);
    // two demo caches and three generated checkpoints, each batched vs alone and greedy
    assert.equal(names.filter((n) => /batched vs alone/.test(n)).length, 5, names.join("\n"));
    assert.equal(names.filter((n) => /greedy 16 tokens/.test(n)).length, 5, names.join("\n"));
    assert.ok(names.some((n) => /sampling in the step/.test(n)), names.join("\n"));
    assert.ok(
      names.some((n) => /KVR_ERR_POOL_EXHAUSTED and changes nothing/.test(n)),
      names.join("\n"),
    );
    // a paged sequence's own calls, KV copies and snapshot chunks vs a contiguous twin
    assert.equal(names.filter((n) => /\/bf16 paged /.test(n)).length, 6, names.join("\n"));
    assert.equal(names.filter((n) => /projection (into|from) a paged/.test(n)).length, 2);
    // the sweep's code path ran at every batch size
    const sweep = report.bench.find((r: { what?: string }) => r.what === "batch decode tok/s");
    assert.ok(sweep, JSON.stringify(report.bench));
    for (const b of [1, 2, 4, 8, 16, 32, 64]) assert.ok(sweep[`b${b}`] > 0, JSON.stringify(sweep));
    assert.match(text, /batched decode tokens\/s/);
  } finally {
    await Deno.remove(out, { recursive: true });
  }
});
