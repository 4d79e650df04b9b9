// Runs the g++ unit test of leave_cpu (native/src/host/worker_pool.h: a decode worker found on its
// caller's CPU moves off it), built by CMake as build/native/kvr_worker_pool_test. Needs 2 CPUs:
// on one CPU the binary reports a skip and the test is ignored.

import { runCheckBinary } from "./check_binary.ts";

const cpus = navigator.hardwareConcurrency;

Deno.test({
  name: "`leave_cpu` moves a thread off its caller's CPU and restores its affinity mask",
  ignore: cpus < 2,
  fn: async () => {
    await runCheckBinary("kvr_worker_pool_test", "worker_pool", 60);
  },
});
