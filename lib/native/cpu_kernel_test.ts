// The per-model kernel cap (NativeModel.load's cpuKernel, kvr_model_params.cpu_kernel): each model
// names the kernels of its own cap while models of other caps live in the same process, the
// process-wide probe keeps auto's; bad values are refused (RangeError before FFI; the native load
// refuses a code above 4). Bit-identity across the paths: gemm_avx512_test.ts, weights_q8/q4_test.ts.

import assert from "node:assert/strict";
import { probeBackend } from "./backend.ts";
import { type CpuKernel, encodeModelParams } from "./layout.ts";
import { openNativeLibrary } from "./library.ts";
import { NativeModel } from "./model.ts";
import {
  checkpoint,
  cpuFlags,
  DEMO_DIRS,
  namedKernels,
  rawModelLoad,
  tokens,
} from "./test_helpers.ts";

Deno.test({
  name:
    "models loaded with different kernel caps each name their own kernels; the probe keeps auto's",
  ignore: Deno.build.os !== "linux" || Deno.build.arch !== "x86_64",
  async fn() {
    const f = cpuFlags();
    const avx2 = f.has("avx2") && f.has("fma");
    const best = avx2 && f.has("avx512f") ? "avx512" : avx2 ? "avx2-fma" : "generic";
    const want: [CpuKernel, string, string][] = [
      ["generic", "generic", "generic"],
      ["auto", best, ""],
      ...(avx2 && f.has("f16c")
        ? [["avx2", "avx2-fma", "avx2"] as [CpuKernel, string, string]]
        : []),
    ];
    const ck = await checkpoint(DEMO_DIRS[0]);
    const models = want.map(([cap]) => NativeModel.load(ck, { threads: 2, cpuKernel: cap }));
    try {
      // Steps of all models in flight together (each nonblocking call on a thread of its own).
      const V = ck.config.vocabSize;
      const seqs = models.map((m) => m.createSequence(16));
      await Promise.all(seqs.map((s) => s.prefill(tokens(8, V, 4))));
      for (const [i, [cap, gemm, q8]] of want.entries()) {
        const k = namedKernels(models[i].deviceInfo);
        assert.equal(k.gemm, gemm, `${cap}: ${models[i].deviceInfo}`);
        if (q8 !== "") assert.equal(k.q8, q8, `${cap}: ${models[i].deviceInfo}`);
      }
      seqs.forEach((s) => s.free());
      assert.equal(namedKernels(probeBackend("cpu").info).gemm, best, "the probe (auto)");
    } finally {
      models.forEach((m) => m.free());
    }
  },
});

Deno.test("`NativeModel.load()` rejects an unknown cpuKernel with a RangeError naming it", async () => {
  const ck = await checkpoint(DEMO_DIRS[0]);
  for (const bad of ["avx", "AVX512", "", 1]) {
    assert.throws(
      () => NativeModel.load(ck, { cpuKernel: bad as CpuKernel }),
      (e: unknown) =>
        e instanceof RangeError &&
        /^cpuKernel must be one of auto, generic, avx2, avxvnni, avx512, got /.test(e.message),
    );
  }
});

Deno.test("kvr_model_load refuses a cpu_kernel above 4 with INVALID_ARGUMENT", async () => {
  const lib = openNativeLibrary();
  const ck = await checkpoint(DEMO_DIRS[0]);
  const params = encodeModelParams(ck.config, "f32", 1);
  new DataView(params.buffer).setUint32(92, 5, true);
  const { status, model } = rawModelLoad(lib, ck, params);
  if (model) lib.symbols.kvr_model_free(model);
  assert.equal(status, -1);
  assert.match(lib.lastError(), /^cpu_kernel 5 is not a kvr_cpu_kernel \(0 auto, 1 generic/);
});
