// Runs the g++ unit tests of native/src/host/kv_values.h (the snapshot import's KV value rule and its
// whole-block forms), built by CMake as build/native/kvr_kv_values_test next to the library
// (scripts/build_native.ts).

import { runCheckBinary } from "./check_binary.ts";

Deno.test("`kvr_kv_values_test` passes every value-cut and block-scan check", async () => {
  await runCheckBinary("kvr_kv_values_test", "kv_values", 3_000_000);
});
