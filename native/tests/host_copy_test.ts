// Runs the g++ unit tests of native/src/host/host_copy.h (the device codec's multi-threaded copy
// between pageable frames and pinned slabs, and its slab plans), built by CMake as
// build/native/kvr_host_copy_test next to the library (scripts/build_native.ts).

import { runCheckBinary } from "./check_binary.ts";

Deno.test("`kvr_host_copy_test` passes every parallel-copy and slab-plan check", async () => {
  await runCheckBinary("kvr_host_copy_test", "host_copy", 1000);
});
