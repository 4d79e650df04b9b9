// Runs the g++ unit tests of native/src/common/sample_math.h (the sampling math shared with
// the CUDA sampling step and the host half of that step), built by CMake as
// build/native/kvr_sample_math_test next to the library (scripts/build_native.ts).

import assert from "node:assert/strict";

const binary = new URL("../../../build/native/kvr_sample_math_test", import.meta.url).pathname;

Deno.test("`kvr_sample_math_test` passes every selection, route and PRNG-agreement check", async () => {
  const { code, stdout, stderr } = await new Deno.Command(binary, {
    stdout: "piped",
    stderr: "piped",
  }).output();
  const out = new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr);
  assert.equal(code, 0, out);
  const m = out.match(/sample_math: (\d+) checks, (\d+) failed/);
  assert.ok(m, out);
  assert.ok(Number(m[1]) > 10000, `too few checks ran: ${m[1]}`);
  assert.equal(Number(m[2]), 0, out);
});
