// Runs the g++ unit tests of native/src/common/batch_plan.h (the CUDA batched step's host plans:
// KV addressing vs the CPU's KvCache, row groups, the batched attention launch), built by CMake as
// build/native/kvr_batch_plan_test next to the library (scripts/build_native.ts).

import { runCheckBinary } from "./check_binary.ts";

Deno.test("`kvr_batch_plan_test` passes every check of the batched step's plans", async () => {
  await runCheckBinary("kvr_batch_plan_test", "batch_plan", 10000);
});
