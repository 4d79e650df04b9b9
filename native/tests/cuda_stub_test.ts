// Runs the g++ test of the CUDA stub (native/tests/cuda_stub_test.cpp), built by CMake as
// build/native/kvr_cuda_stub_test in every build, so the "built without CUDA" answer stays tested
// even where the library itself has the CUDA backend.

import assert from "node:assert/strict";

const binary = new URL("../../build/native/kvr_cuda_stub_test", import.meta.url).pathname;

Deno.test('the CUDA stub answers UNSUPPORTED "built without CUDA support" to the probe and to a load', async () => {
  const { code, stdout, stderr } = await new Deno.Command(binary, {
    stdout: "piped",
    stderr: "piped",
  }).output();
  const out = new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr);
  assert.equal(code, 0, out);
  assert.match(out, /^cuda_stub: 0 failed$/m);
});
