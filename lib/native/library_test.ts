// Tests for openNativeLibrary (path resolution, memoization, ABI check, error listing the path
// and build command), EngineError status names and dtype helpers. Needs the built library
// (`deno task build:native`, or KVRELAY_LIB pointing at one).

import assert from "node:assert/strict";
import { openNativeLibrary } from "./library.ts";
import { EngineError } from "./errors.ts";
import { dtypeByteSize, type KvDtype } from "./dtype.ts";
import { cpuKernelName } from "./gemm.ts";

Deno.test("`openNativeLibrary()` opens the library once per path and checks ABI version 3", () => {
  const lib = openNativeLibrary();
  assert.equal(lib.abiVersion, 4);
  assert.equal(openNativeLibrary(), lib);
  assert.equal(openNativeLibrary(lib.path), lib);
  assert.match(cpuKernelName(), /^(avx512|avx2-fma|generic)$/);
});

Deno.test("`openNativeLibrary()` lists the path tried and the build command when dlopen fails", () => {
  assert.throws(() => openNativeLibrary("/nonexistent/libkvrelay.so"), (e: unknown) => {
    assert.ok(e instanceof Error);
    assert.match(e.message, /tried \/nonexistent\/libkvrelay\.so \(argument\)/);
    assert.match(e.message, /deno task build:native/);
    return true;
  });
});

Deno.test("`EngineError` carries the kvr_status code and its name", () => {
  const e = new EngineError(-3, "length 10 + 5 > capacity 12", "kvr_seq_prefill");
  assert.equal(e.code, -3);
  assert.equal(e.codeName, "CAPACITY");
  assert.equal(e.message, "kvr_seq_prefill failed (CAPACITY, -3): length 10 + 5 > capacity 12");
  assert.equal(new EngineError(-7, "x").codeName, "CORRUPT");
  assert.equal(new EngineError(-99, "x").codeName, "UNKNOWN");
});

Deno.test("`dtypeByteSize()` gives 4/2/2 bytes and refuses other names", () => {
  assert.deepEqual((["f32", "f16", "bf16"] as KvDtype[]).map(dtypeByteSize), [4, 2, 2]);
  assert.throws(() => dtypeByteSize("f64" as KvDtype), /must be "f32", "f16" or "bf16", got "f64"/);
});
