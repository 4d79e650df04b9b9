// Runs the g++ unit tests of native/src/common/device_math.h (the math the CPU and CUDA backends
// share: dtype rounding, RoPE cos/sin, softmax merge, launch plans), built by CMake as
// build/native/kvr_device_math_test next to the library (scripts/build_native.ts).

import assert from "node:assert/strict";
import { runCheckBinary } from "./check_binary.ts";

Deno.test("`kvr_device_math_test` passes every check of the shared host/device math", async () => {
  const out = await runCheckBinary("kvr_device_math_test", "device_math", 1000);
  // RoPE cos/sin agree with glibc's correctly rounded values (printed by the binary).
  assert.match(out, /rope: \d+ of \d+ f32 cos\/sin differ from glibc's/);
});
