// Runs the g++ unit tests of native/src/common/sample_math.h (the sampling math shared with
// the CUDA sampling step and the host half of that step), built by CMake as
// build/native/kvr_sample_math_test next to the library (scripts/build_native.ts).

import { runCheckBinary } from "./check_binary.ts";

Deno.test("`kvr_sample_math_test` passes every selection, route and PRNG-agreement check", async () => {
  await runCheckBinary("kvr_sample_math_test", "sample_math", 10000);
});
