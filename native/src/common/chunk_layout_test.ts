// Runs the g++ unit tests of native/src/common/chunk_layout.h (snapshot chunk frame layout and
// the CRC32C combination the CUDA codec checksums frames with), built by CMake as
// build/native/kvr_chunk_layout_test next to the library (scripts/build_native.ts).

import assert from "node:assert/strict";

const binary = new URL("../../../build/native/kvr_chunk_layout_test", import.meta.url).pathname;

Deno.test("`kvr_chunk_layout_test` passes every layout and CRC32C-combination check", async () => {
  const { code, stdout, stderr } = await new Deno.Command(binary, {
    stdout: "piped",
    stderr: "piped",
  }).output();
  const out = new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr);
  assert.equal(code, 0, out);
  const m = out.match(/chunk_layout: (\d+) checks, (\d+) failed/);
  assert.ok(m, out);
  assert.ok(Number(m[1]) > 1000, `too few checks ran: ${m[1]}`);
  assert.equal(Number(m[2]), 0, out);
});
