// Runs the g++ unit tests of native/src/common/chunk_layout.h (snapshot chunk frame layout and
// the CRC32C combination the CUDA codec checksums frames with), built by CMake as
// build/native/kvr_chunk_layout_test next to the library (scripts/build_native.ts).

import { runCheckBinary } from "./check_binary.ts";

Deno.test("`kvr_chunk_layout_test` passes every layout and CRC32C-combination check", async () => {
  await runCheckBinary("kvr_chunk_layout_test", "chunk_layout", 1000);
});
