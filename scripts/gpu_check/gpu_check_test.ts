// Keeps the GPU check from rotting on machines without a GPU: runs its driver
// (scripts/gpu_check/gpu_check.py) in dry-run mode, where the CPU backend stands in for CUDA,
// over its correctness section (demo models and generated checkpoints of every family and
// weight dtype vs the CPU backend and a float64 numpy reference, KV round trip, greedy
// agreement; one process per model) plus the probe checks, its coverage section (151,936-token
// vocabulary, long context, forced fallback GEMM, scalar GEMV), its handoff section, and its
// batched-step section (batched vs alone, native sampling in the step, pool exhaustion, the
// batch-size sweep's code path). Needs python3 with numpy (.ci/run installs it). The planted
// faults (a failing probe, sections that raise, crash, hang or are terminated; the sanitizer
// verdicts; the build fallback) are in gpu_check_faults_test.ts.

import assert from "node:assert/strict";
import { runDriver } from "./run_driver.ts";

// A generous budget: the dry run's CPU is slower than the GPU the shares are sized for.
const DRY = ["--dry-run", "--quick", "--budget", "900"];

Deno.test("gpu_check.py --dry-run passes its correctness and probe checks on the CPU backend", async () => {
  const { code, text, report } = await runDriver([...DRY, "--sections", "correctness"]);
  assert.equal(code, 0, text.slice(-4000));
  const m = text.match(/RESULT: (\d+) passed, (\d+) failed/);
  assert.ok(m, text.slice(-2000));
  assert.equal(Number(m[2]), 0, text.slice(-4000));
  assert.ok(report);
  assert.equal(report.failed, 0);
  assert.equal(report.passed, Number(m[1]));
  // 3 demo models × 2 KV dtypes (+ tiny-fast in f16) and 7 generated checkpoints, each with
  // several checks, each model in its own process.
  const models = new Set(
    report.checks.filter((c) => c.section === "correctness").map((c) => c.name.split(" ")[0]),
  );
  assert.ok(models.size >= 14, `models checked: ${[...models].join(", ")}`);
  assert.ok(models.has("tiny-fast/f16"), [...models].join(", "));
  assert.equal((text.match(/== correctness /g) ?? []).length, 10, text.slice(-3000));
  assert.ok(report.skipped.length === 0, JSON.stringify(report.skipped));
});

Deno.test("gpu_check.py --dry-run passes its coverage checks (vocab 151936 sampling, 4k context, f16 KV, forced fallback GEMM, scalar GEMV)", async () => {
  const { code, text, report } = await runDriver([...DRY, "--sections", "coverage"]);
  assert.equal(code, 0, text.slice(-4000));
  assert.ok(report);
  assert.equal(report.failed, 0, text.slice(-4000));
  const names = report.checks.filter((c) => c.section === "coverage").map((c) => c.name);
  const count = (re: RegExp) => names.filter((n) => re.test(n)).length;
  assert.equal(
    count(/^vocab 151936 device sampling vs the reference sampler/),
    5,
    names.join("\n"),
  );
  assert.equal(count(/^vocab 151936: prefill/), 1, names.join("\n"));
  for (const kv of ["f32", "f16"]) {
    assert.equal(count(new RegExp(`^long context/${kv}: `)), 3, names.join("\n"));
  }
  assert.ok(names.includes("long context/f16: 8 decodes at context 4096 vs cpu"), names.join("\n"));
  assert.equal(count(/^fallback GEMM /), 4, names.join("\n"));
  assert.equal(count(/scalar GEMV/), 3, names.join("\n"));
  assert.equal(report.skipped.length, 0, JSON.stringify(report.skipped));
});

Deno.test("gpu_check.py --dry-run passes its handoff checks (golden-snapshot codec, projection, sampling, fit) on the CPU backend", async () => {
  const { code, text, report } = await runDriver([...DRY, "--sections", "handoff"]);
  assert.equal(code, 0, text.slice(-4000));
  assert.ok(report);
  assert.equal(report.failed, 0, text.slice(-4000));
  const names = report.checks.filter((c) => c.section === "handoff").map((c) => c.name);
  // every golden file exported byte for byte and imported, plus the projection checks
  assert.equal(names.filter((n) => /byte-identical to the golden file/.test(n)).length, 7);
  assert.equal(names.filter((n) => /restores the CPU's KV/.test(n)).length, 7);
  assert.ok(names.some((n) => /KL\(full ‖ migrated\)/.test(n)), names.join("\n"));
  // decode_sample vs the reference sampler for every sampling configuration
  assert.equal(names.filter((n) => /device sampling vs the reference sampler/.test(n)).length, 5);
  // fit statistics (G, C, yy of keys and values) vs the CPU's
  assert.equal(names.filter((n) => /fit statistics vs CPU/.test(n)).length, 6);
});

Deno.test("gpu_check.py --dry-run passes its batched-step checks (batched vs alone, sampling in the step, pool exhaustion) on the CPU backend", async () => {
  const { code, text, report } = await runDriver([...DRY, "--sections", "batch"]);
  assert.equal(code, 0, text.slice(-4000));
  assert.ok(report);
  assert.equal(report.failed, 0, text.slice(-4000));
  const names = report.checks.filter((c) => c.section === "batch").map((c) => c.name);
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
  // the sweep's code path ran at every batch size (its row came back from the section's process)
  const sweep = report.bench.find((r) => r.what === "batch decode tok/s");
  assert.ok(sweep, JSON.stringify(report.bench));
  for (const b of [1, 2, 4, 8, 16, 32, 64]) {
    assert.ok(Number(sweep[`b${b}`]) > 0, JSON.stringify(sweep));
  }
  assert.match(text, /batched decode tokens\/s/);
});
