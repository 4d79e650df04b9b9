// Runs the g++ unit test of the per-computation kernel cap (native/src/host/cpu_features.h: what
// each cap allows, KernelScope per thread, the caller's cap on every thread of a worker-pool or
// OpenMP region), built by CMake as build/native/kvr_kernel_cap_test.

import { runCheckBinary } from "./check_binary.ts";

Deno.test("`KernelScope` narrows the kernels of its thread and of every thread computing for it", async () => {
  await runCheckBinary("kvr_kernel_cap_test", "kernel_cap", 40);
});
