// Runs one of the g++ unit-test binaries CMake builds next to the library (build/native/<name>)
// and checks its summary line "<label>: N checks, M failed" (N above a floor, M = 0). Shared by
// the *_test.ts runners of native/src; not a test itself.

import assert from "node:assert/strict";

/**
 * Runs build/native/`name` and asserts it exited 0 and reported at least `minChecks` checks and
 * no failure.
 * @param name binary name (e.g. "kvr_chunk_layout_test")
 * @param label the summary line's prefix (e.g. "chunk_layout")
 * @param minChecks floor of the reported check count (a test that ran nothing fails)
 * @param args command-line arguments of the run
 * @returns the binary's stdout + stderr, for further assertions
 * @throws AssertionError when the binary fails, reports failures or too few checks
 */
export async function runCheckBinary(
  name: string,
  label: string,
  minChecks: number,
  args: string[] = [],
): Promise<string> {
  const binary = new URL(`../../build/native/${name}`, import.meta.url).pathname;
  const { code, stdout, stderr } = await new Deno.Command(binary, {
    stdout: "piped",
    stderr: "piped",
    args,
  }).output();
  const out = new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr);
  assert.equal(code, 0, out);
  const m = out.match(new RegExp(`${label}: (\\d+) checks, (\\d+) failed`));
  assert.ok(m, out);
  assert.ok(Number(m[1]) > minChecks, `too few checks ran: ${m[1]}`);
  assert.equal(Number(m[2]), 0, out);
  return out;
}
