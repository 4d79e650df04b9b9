// Runs the g++ unit tests of native/src/common/sample_math.h (the sampling math shared with
// the CUDA sampling step and the host half of that step), built by CMake as
// build/native/kvr_sample_math_test next to the library (scripts/build_native.ts).

import assert from "node:assert/strict";
import { runCheckBinary } from "./check_binary.ts";

Deno.test("`kvr_sample_math_test` passes every selection, route and PRNG-agreement check", async () => {
  await runCheckBinary("kvr_sample_math_test", "sample_math", 10000);
});

// The sampler's exp over a vocabulary has a path per instruction set (host/sampling.cpp
// js_exp_many), each checked bit for bit against the scalar exp by the binary: run it under each
// kernel cap that selects a path this CPU has (its argument), and check that the path it names is
// the one the CPU's flags call for (so a vector path cannot silently fall back to scalar).
const flags = new Set(
  (Deno.readTextFileSync("/proc/cpuinfo").match(/^flags\s*:(.*)$/m)?.[1] ?? "").trim().split(/\s+/),
);
const best = flags.has("avx512f")
  ? "avx512"
  : flags.has("avx2") && flags.has("fma")
  ? "avx2"
  : "scalar";
for (
  const [kernel, path] of [
    ["auto", best],
    ["avx2", best === "scalar" ? "scalar" : "avx2"],
    ["generic", "scalar"],
  ] as const
) {
  Deno.test(`\`kvr_sample_math_test\`: the ${path} exp path equals the scalar exp (kernel cap ${kernel})`, async () => {
    const out = await runCheckBinary("kvr_sample_math_test", "sample_math", 10000, [kernel]);
    assert.equal(out.match(/exp path: (\w+)/)?.[1], path, out);
  });
}
