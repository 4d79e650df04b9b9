// The GPU check must not mislead when it goes wrong: planted faults in its dry run (the CPU
// backend standing in for CUDA). A failing CUDA probe stops it (no CPU-vs-CPU comparison passes as
// a result); a section that raises or whose process dies fails only itself; a hung section is
// killed at its deadline; SIGTERM mid-bench still writes gpu_check.json; each compute-sanitizer
// tool is judged by its own summary line; gpu_check.sh retries a failed -Werror build once without
// it and picks cuBLASLt by soname. Fakes stand in for compute-sanitizer and cmake.

import assert from "node:assert/strict";
import { driver, lib, readReport, root, runDriver } from "./run_driver.ts";

Deno.test("without a usable CUDA device and without --dry-run the check stops after the probe and fails", async () => {
  const { code, text, report } = await runDriver(["--quick", "--sections", "correctness,coverage"]);
  assert.ok(report, text);
  if (String(report.info.cuda_probe).startsWith("cuda:")) return; // a GPU is here: nothing to plant
  assert.equal(code, 1, text.slice(-3000));
  const failed = report.checks.filter((c) => !c.ok).map((c) => c.name);
  assert.deepEqual(failed, ["a CUDA device is usable"]);
  // no section ran: nothing compared the CPU with itself
  assert.deepEqual([...new Set(report.checks.map((c) => c.section))], ["probe"]);
  assert.ok(
    report.skipped.some((s) => /no usable CUDA device/.test(s.why)),
    JSON.stringify(report.skipped),
  );
  assert.match(text, /STOPPED: no usable CUDA device/);
});

Deno.test("a correctness model whose process raises or dies fails alone; every other model still passes", async () => {
  const { code, text, report } = await runDriver([
    "--dry-run",
    "--quick",
    "--budget",
    "900",
    "--sections",
    "correctness",
    "--plant",
    "crash:correctness:tiny-balanced",
    "--plant",
    "raise:correctness:qwen2-f32-hd64-g1",
  ]);
  assert.equal(code, 1, text.slice(-3000));
  assert.ok(report);
  const failed = report.checks.filter((c) => !c.ok);
  assert.equal(failed.length, 2, JSON.stringify(failed));
  assert.match(
    failed.find((c) => c.name.includes("tiny-balanced"))?.detail ?? "",
    /killed by SIGKILL/,
  );
  assert.match(
    failed.find((c) => c.name.includes("qwen2-f32-hd64-g1"))?.detail ?? "",
    /raised RuntimeError: planted fault/,
  );
  const passedModels = new Set(
    report.checks.filter((c) => c.section === "correctness" && c.ok).map((c) =>
      c.name.split("/")[0]
    ),
  );
  for (const m of ["tiny-fast", "tiny-powerful", "llama-bf16-hd32-g2", "qwen3-f16-hd32-g4"]) {
    assert.ok(passedModels.has(m), `${m} missing from ${[...passedModels].join(", ")}`);
  }
  assert.ok(!passedModels.has("tiny-balanced") && !passedModels.has("qwen2-f32-hd64-g1"));
});

Deno.test("a hung section is killed at its deadline, and SIGTERM mid-bench still writes gpu_check.json", async () => {
  const out = await Deno.makeTempDir({ prefix: "gpu_check_term_" });
  let benchPid = 0;
  try {
    const child = new Deno.Command("python3", {
      args: [
        driver,
        "--lib",
        lib,
        "--out",
        out,
        "--dry-run",
        "--budget",
        "80",
        "--sections",
        "coverage,bench",
        "--plant",
        "hang:coverage",
        "--plant",
        "hang:bench",
      ],
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    // read stdout until the bench's process has started and hangs
    const reader = child.stdout.getReader();
    let text = "";
    while (!/planted hang in bench \(pid (\d+)\)/.test(text)) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    benchPid = Number(text.match(/planted hang in bench \(pid (\d+)\)/)?.[1]);
    assert.ok(benchPid > 0, text);
    // written after every section: the coverage hang is already in it, the bench is running
    const before = await readReport(out);
    assert.ok(before, text);
    assert.equal(before.running, "bench");
    assert.equal(before.terminated, false);
    const hung = before.checks.find((c) => c.section === "coverage" && !c.ok);
    assert.match(hung?.name ?? "", /finished within its deadline/);
    assert.match(hung?.detail ?? "", /killed after/);
    child.kill("SIGTERM");
    // a section process left behind would keep stdout open: read it for at most 60 s
    const timer = setTimeout(() => reader.cancel(), 60_000);
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        text += new TextDecoder().decode(value);
      }
    } finally {
      clearTimeout(timer);
    }
    const status = await child.status;
    assert.equal(status.code, 1, text);
    const after = await readReport(out);
    assert.ok(after, text);
    assert.equal(after.terminated, true);
    const term = after.checks.find((c) => c.name === "finished before SIGTERM");
    assert.equal(term?.section, "bench", JSON.stringify(after.checks));
    assert.equal(after.failed, 2, JSON.stringify(after.checks));
    assert.match(text, /RESULT: \d+ passed, 2 failed/);
    // the hung bench process went with it
    const ps = await new Deno.Command("kill", { args: ["-0", String(benchPid)], stderr: "null" })
      .output();
    assert.notEqual(ps.code, 0, `bench process ${benchPid} still alive`);
  } finally {
    if (benchPid > 0) {
      await new Deno.Command("kill", { args: ["-9", String(benchPid)], stderr: "null" }).output();
    }
    await Deno.remove(out, { recursive: true });
  }
});

// A stand-in for compute-sanitizer: runs the target command and prints the summary line of the
// tool it was asked for (clean, or with errors when FAKE_SANITIZER_ERRORS is set); it refuses a
// memcheck without --report-api-errors no.
const FAKE_SANITIZER = `#!/usr/bin/env bash
tool=""; api=yes
while [ "$1" != "--error-exitcode" ]; do
  case "$1" in --tool) tool=$2; shift;; --report-api-errors) api=$2; shift;; esac; shift
done
shift 2
"$@" || exit 1
if [ "$tool" = memcheck ] && [ "$api" != no ]; then echo "========= ERROR SUMMARY: 3 errors (api errors)"; exit 9; fi
n=\${FAKE_SANITIZER_ERRORS:-0}
if [ "$tool" = racecheck ]; then
  echo "========= RACECHECK SUMMARY: $n hazards displayed ($n errors, 0 warnings)"
else
  echo "========= ERROR SUMMARY: $n errors"
fi
[ "$n" = 0 ] || exit 9
`;

Deno.test("the sanitizer section judges memcheck by ERROR SUMMARY and racecheck by RACECHECK SUMMARY", async () => {
  const dir = await Deno.makeTempDir({ prefix: "fake_sanitizer_" });
  try {
    const exe = `${dir}/compute-sanitizer`;
    await Deno.writeTextFile(exe, FAKE_SANITIZER, { mode: 0o755 });
    const args = ["--dry-run", "--budget", "900", "--sections", "sanitizer", "--sanitizer", exe];
    const clean = await runDriver(args);
    assert.equal(clean.code, 0, clean.text.slice(-3000));
    const ok = clean.report?.checks.filter((c) => c.section === "sanitizer") ?? [];
    assert.deepEqual(ok.map((c) => [c.name, c.ok]), [
      ["memcheck on a short run", true],
      ["racecheck on a short run", true],
    ], JSON.stringify(ok));
    assert.match(ok[1].detail, /RACECHECK SUMMARY: 0 hazards displayed/);
    const dirty = await runDriver(args, { FAKE_SANITIZER_ERRORS: "2" });
    assert.equal(dirty.code, 1, dirty.text.slice(-3000));
    const bad = dirty.report?.checks.filter((c) => c.section === "sanitizer") ?? [];
    assert.deepEqual(bad.map((c) => c.ok), [false, false], JSON.stringify(bad));
    assert.match(bad[0].detail, /ERROR SUMMARY: 2 errors/);
    assert.match(bad[1].detail, /2 errors, 0 warnings/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

// A stand-in for cmake: remembers KVR_WERROR at configure; the build fails on a warning made an
// error when it is ON, else prints the warning and "builds" by copying the real library.
const FAKE_CMAKE = `#!/usr/bin/env bash
echo "cmake $*" >>"$FAKE_CMAKE_LOG"
if [ "$1" = --build ]; then
  if [ "$(cat "$2/werror")" = ON ]; then
    echo "kv.cpp:7:9: error: unused variable 'x' [-Werror=unused-variable]"; exit 2
  fi
  echo "kv.cpp:7:9: warning: unused variable 'x' [-Wunused-variable]"
  cp "$FAKE_CMAKE_LIB" "$2/libkvrelay.so"; exit 0
fi
while [ $# -gt 0 ]; do
  case "$1" in -B) dir=$2; shift;; -DKVR_WERROR=*) werror=\${1#-DKVR_WERROR=};; esac; shift
done
mkdir -p "$dir"; echo "$werror" >"$dir/werror"
`;

Deno.test("gpu_check.sh retries a failed -Werror build once without it, reports the warnings, and picks cuBLASLt by soname", async () => {
  const dir = await Deno.makeTempDir({ prefix: "fake_cmake_" });
  try {
    await Deno.mkdir(`${dir}/bin`);
    await Deno.writeTextFile(`${dir}/bin/cmake`, FAKE_CMAKE, { mode: 0o755 });
    // two wheels' folders: sorting the paths would pick cublas/lib (".so.12": "cu13" < "cublas")
    for (
      const [sub, so] of [["a/nvidia/cublas/lib", "libcublasLt.so.12"], [
        "b/nvidia/cu13/lib",
        "libcublasLt.so.13",
      ]]
    ) {
      await Deno.mkdir(`${dir}/${sub}`, { recursive: true });
      await Deno.writeTextFile(`${dir}/${sub}/${so}`, "");
    }
    const out = `${dir}/out`;
    const { code, stdout, stderr } = await new Deno.Command("bash", {
      args: [`${root}scripts/gpu_check.sh`, "--dry-run", "--sections", "probe"],
      env: {
        PATH: `${dir}/bin:${Deno.env.get("PATH")}`,
        OUT: out,
        KVRELAY_LIB: "", // build (with the fake cmake)
        BUILD_DIR: `${dir}/build`,
        CUBLASLT_SEARCH: `${dir}/a:${dir}/b`,
        FAKE_CMAKE_LOG: `${dir}/cmake.log`,
        FAKE_CMAKE_LIB: lib,
      },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr);
    assert.equal(code, 1, text);
    assert.match(text, /retrying once without -Werror/);
    assert.match(text, new RegExp(`cuBLASLt: ${dir}/b/nvidia/cu13/lib/libcublasLt\\.so\\.13`));
    const calls = (await Deno.readTextFile(`${dir}/cmake.log`)).trim().split("\n");
    assert.deepEqual(calls.map((c) => c.match(/-DKVR_WERROR=(\w+)|--build/)?.[0]), [
      "-DKVR_WERROR=ON",
      "--build",
      "-DKVR_WERROR=OFF",
      "--build",
    ]);
    const report = await readReport(out);
    assert.ok(report, text);
    const build = report.checks.find((c) => c.section === "build");
    assert.equal(build?.ok, false, JSON.stringify(report.checks));
    assert.match(build?.detail ?? "", /unused variable 'x' \[-Wunused-variable\]/);
    // the probe still ran on the library the retry built
    assert.ok(
      report.checks.some((c) => c.name === "cpu probe OK" && c.ok),
      JSON.stringify(report.checks),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
