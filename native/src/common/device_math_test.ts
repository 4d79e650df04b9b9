// Runs the g++ unit tests of native/src/common/device_math.h (the math the CPU and CUDA backends
// share: dtype rounding, RoPE cos/sin, softmax merge, launch plans), built by CMake as
// build/native/kvr_device_math_test next to the library (scripts/build_native.ts).

import assert from "node:assert/strict";

const binary = new URL("../../../build/native/kvr_device_math_test", import.meta.url).pathname;

Deno.test("`kvr_device_math_test` passes every check of the shared host/device math", async () => {
  const { code, stdout, stderr } = await new Deno.Command(binary, {
    stdout: "piped",
    stderr: "piped",
  })
    .output();
  const out = new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr);
  assert.equal(code, 0, out);
  const m = out.match(/device_math: (\d+) checks, (\d+) failed/);
  assert.ok(m, out);
  assert.ok(Number(m[1]) > 1000, `too few checks ran: ${m[1]}`);
  assert.equal(Number(m[2]), 0, out);
  // RoPE cos/sin agree with glibc's correctly rounded values (printed by the binary).
  assert.match(out, /rope: \d+ of \d+ f32 cos\/sin differ from glibc's/);
});
