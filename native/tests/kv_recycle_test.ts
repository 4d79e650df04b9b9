// Runs the g++ unit tests of native/src/core/kv_recycle.h (the CPU backend's per-model recycling of
// freed KV cache buffers) and of KvCache's release into it, built by CMake as
// build/native/kvr_kv_recycle_test next to the library (scripts/build_native.ts).

import { runCheckBinary } from "./check_binary.ts";

Deno.test("`kvr_kv_recycle_test` passes every no-leak and budget check", async () => {
  await runCheckBinary("kvr_kv_recycle_test", "kv_recycle", 3000);
});
