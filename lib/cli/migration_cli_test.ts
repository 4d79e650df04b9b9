// End-to-end runs of the migration CLI commands as real processes on the demo models: `fit` on a
// few calibration windows writes a valid artifact and prints a JSON last line, `eval-migration`
// and `compare` print the documented JSON shapes, and usage errors exit 2.

import assert from "node:assert/strict";
import { readProjectorMeta } from "../migrate/mod.ts";

const root = new URL("../../", import.meta.url).pathname;
const text = `${root}models/README.md`;

async function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${root}lib/cli/main.ts`, ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

function lastJson(stdout: string): Record<string, unknown> {
  const lines = stdout.trim().split("\n");
  return JSON.parse(lines[lines.length - 1]);
}

Deno.test("fit, eval-migration and compare CLIs print their JSON last lines on the demo pair", async () => {
  const out = await Deno.makeTempDir({ prefix: "kvr-fit-" });
  try {
    const models = `${root}models`;
    const fit = await cli([
      "fit",
      "--source",
      `${models}/tiny-fast`,
      "--target",
      `${models}/tiny-balanced`,
      "--corpus",
      text,
      text,
      "--out",
      out,
      "--tokens",
      "512",
      "--heldout-tokens",
      "256",
      "--window",
      "128",
      "--lambda",
      "0.01",
      "--source-layers",
      "all",
      "--eval-file",
      text,
      "--eval-prefix",
      "48",
      "--eval-continuation",
      "16",
      "--eval-repair",
      "1,8",
      "--eval-windows",
      "2",
    ]);
    assert.equal(fit.code, 0, fit.stderr);
    // stderr is a pipe here: one progress line per finished phase, no redrawn bar.
    assert.match(fit.stderr, /calibration windows 6\/6 in \d+s\n/);
    assert.doesNotMatch(fit.stderr, /\r/);
    const summary = lastJson(fit.stdout);
    assert.equal(summary.tokens, 512);
    const meta = await readProjectorMeta(out);
    assert.equal(meta.source.name, "tiny-fast");
    assert.equal(meta.target.name, "tiny-balanced");
    assert.deepEqual(Object.keys(meta.quality!.repair), ["1", "8"]);

    const evArgs = [
      "eval-migration",
      "--source",
      `${models}/tiny-fast`,
      "--target",
      `${models}/tiny-balanced`,
      "--projector",
      out,
      "--file",
      text,
      "--prefix",
      "48",
      "--continuation",
      "16",
      "--repair",
      "1,4",
      "--json",
      "--max-windows",
      "2",
    ];
    const ev = await cli(evArgs);
    assert.equal(ev.code, 0, ev.stderr);
    const r = lastJson(ev.stdout);
    for (
      const key of [
        "windows",
        "full_nll",
        "no_prefix_nll",
        "source_nll",
        "no_prefix_kl",
        "no_prefix_top1_agreement",
        "full_ttft_ms",
      ]
    ) {
      assert.equal(typeof r[key], "number", key);
    }
    const rep = r.repair as Record<string, Record<string, number>>;
    assert.deepEqual(Object.keys(rep), ["1", "4"]);
    for (const key of ["nll", "recovered", "kl", "kl_recovered", "top1_agreement", "ttft_ms"]) {
      assert.equal(typeof rep["4"][key], "number", key);
    }

    // --target-weights quantizes the target only: the source's NLL is unchanged, the target's
    // full-prefill NLL moves; a bad format is a usage error naming the flag.
    const q4 = await cli([...evArgs, "--target-weights", "q4"]);
    assert.equal(q4.code, 0, q4.stderr);
    const rq = lastJson(q4.stdout);
    assert.equal(rq.source_nll, r.source_nll);
    assert.notEqual(rq.full_nll, r.full_nll);
    const badWeights = await cli([...evArgs, "--target-weights", "q3"]);
    assert.equal(badWeights.code, 2, badWeights.stderr);
    assert.match(badWeights.stderr, /--target-weights must be bf16, q8, q4, got "q3"/);

    const cmp = await cli([
      "compare",
      "--source",
      `${models}/tiny-fast`,
      "--target",
      `${models}/tiny-balanced`,
      "--projector",
      out,
      "--prompt",
      "The old man walked down to the harbour and looked at the boats that had come in",
      "--max-tokens",
      "4",
      "--seed",
      "3",
    ]);
    assert.equal(cmp.code, 0, cmp.stderr);
    const c = lastJson(cmp.stdout);
    for (const key of ["baseline_response", "accelerated_response"]) {
      assert.equal(typeof c[key], "string");
    }
    for (
      const key of [
        "baseline_latency_ms",
        "accelerated_latency_ms",
        "speedup",
        "migrated_tokens",
        "repair_tokens",
      ]
    ) {
      assert.equal(typeof c[key], "number", key);
    }
    assert.equal(c.repair_tokens, meta.repair_default);

    const bad = await cli([
      "eval-migration",
      "--source",
      `${models}/tiny-fast`,
      "--target",
      `${models}/tiny-balanced`,
      "--file",
      text,
      "--prefix",
      "8",
      "--continuation",
      "8",
      "--repair",
      "8",
    ]);
    assert.equal(bad.code, 2, bad.stderr);
    assert.match(bad.stderr, /--repair 8 must be < --prefix 8/);
  } finally {
    await Deno.remove(out, { recursive: true });
  }
});

Deno.test("`fit --backend cuda` fails with the CUDA probe's reason and writes nothing; `--backend cpu` fits; a bad backend is a usage error", async () => {
  const { probeBackend } = await import("../native/mod.ts");
  const models = `${root}models`;
  const out = await Deno.makeTempDir({ prefix: "kvr-fit-backend-" });
  try {
    const base = [
      "fit",
      "--source",
      `${models}/tiny-fast`,
      "--target",
      `${models}/tiny-balanced`,
      "--corpus",
      text,
      "--tokens",
      "256",
      "--heldout-tokens",
      "128",
      "--window",
      "128",
      "--lambda",
      "0.01",
      "--source-layers",
      "all",
      "--threads",
      "1",
    ];
    const probe = probeBackend("cuda");
    if (probe.ok) {
      console.log(`  CUDA device present (${probe.info}): the no-device case is not exercised`);
    } else {
      const cuda = await cli([...base, "--out", `${out}/cuda`, "--backend", "cuda"]);
      assert.equal(cuda.code, 1, cuda.stderr);
      assert.equal(cuda.stdout, "");
      assert.ok(cuda.stderr.includes(`UNSUPPORTED, -5): ${probe.info}`), cuda.stderr);
      assert.equal(cuda.stderr.trimEnd().split("\n").length, 1, cuda.stderr);
      await assert.rejects(() => Deno.stat(`${out}/cuda/projector.json`), Deno.errors.NotFound);
    }
    const cpu = await cli([...base, "--out", `${out}/cpu`, "--backend", "cpu"]);
    assert.equal(cpu.code, 0, cpu.stderr);
    assert.equal((await readProjectorMeta(`${out}/cpu`)).kind, "linear");
    const bad = await cli([...base, "--out", `${out}/bad`, "--backend", "gpu"]);
    assert.equal(bad.code, 2, bad.stderr);
    assert.ok(bad.stderr.includes('--backend must be auto, cpu or cuda, got "gpu"'), bad.stderr);
  } finally {
    await Deno.remove(out, { recursive: true });
  }
});
