// Properties of the built libraries (build/native, CMakeLists.txt): only the C ABI is exported
// (the production library kvrelay.h's, the test library that plus kvrelay_test.h's),
// and a build made where nvcc exists compiles the CUDA backend (its probe then answers with the
// CUDA runtime's reason on a machine without a GPU, not the stub's "built without CUDA").

import assert from "node:assert/strict";

const root = new URL("../", import.meta.url).pathname;
const lib = Deno.env.get("KVRELAY_LIB") ?? `${root}build/native/libkvrelay.so`;

async function run(cmd: string, args: string[]): Promise<string> {
  const { code, stdout, stderr } = await new Deno.Command(cmd, {
    args,
    stdout: "piped",
    stderr: "piped",
  })
    .output();
  assert.equal(code, 0, new TextDecoder().decode(stderr));
  return new TextDecoder().decode(stdout);
}

Deno.test("libkvrelay exports only kvr_* symbols (static CUDA runtime and libstdc++ stay hidden)", async () => {
  const out = await run("nm", ["-D", "--defined-only", lib]);
  const names = out.split("\n").filter((l) => l.trim()).map((l) => l.trim().split(/\s+/).pop()!);
  assert.ok(names.length >= 40, `only ${names.length} exported symbols`);
  assert.deepEqual(names.filter((n) => !n.startsWith("kvr_")), []);
});

Deno.test("the production library exports exactly kvrelay.h; the test library adds exactly kvrelay_test.h", async () => {
  const { parseHeader } = await import("../lib/native/header_symbols.ts");
  const { testLibraryPath } = await import("../lib/native/test_library.ts");
  const exported = async (path: string) =>
    (await run("nm", ["-D", "--defined-only", path])).split("\n").filter((l) => l.trim())
      .map((l) => l.trim().split(/\s+/).pop()!).sort();
  const header = await Deno.readTextFile(`${root}native/include/kvrelay.h`);
  const testHeader = await Deno.readTextFile(`${root}native/include/kvrelay_test.h`);
  const production = parseHeader(header).map((f) => f.name).sort();
  const hooks = parseHeader(testHeader, header).map((f) => f.name).sort();
  assert.deepEqual(await exported(lib), production);
  assert.deepEqual(await exported(testLibraryPath()), [...production, ...hooks].sort());
});

Deno.test("a build with nvcc compiles the CUDA backend: the probe gives CUDA's reason, not the stub's", async () => {
  const cache = await Deno.readTextFile(`${root}build/native/CMakeCache.txt`).catch(() => "");
  const cudaBuilt = /^KVR_CUDA:BOOL=ON$/m.test(cache) &&
    /^CMAKE_CUDA_COMPILER:[^=]*=.+$/m.test(cache);
  const { openNativeLibrary } = await import("../lib/native/library.ts");
  const l = openNativeLibrary(lib);
  const info = new Uint8Array(512);
  const st = l.symbols.kvr_backend_probe(1, 0, info, 512n);
  const text = new TextDecoder().decode(info.subarray(0, info.indexOf(0)));
  if (st === 0) return; // a machine with a GPU: nothing to say here (scripts/gpu_check.sh covers it)
  if (cudaBuilt && !Deno.env.get("KVRELAY_LIB")) {
    assert.match(text, /^no CUDA device: cuda[A-Za-z]+ \(\d+\): /);
  } else {
    assert.match(text, /^(built without CUDA support|no CUDA device: )/);
  }
});

// CI compiles the CUDA backend into build/cuda where nvcc exists (.ci/run), whatever
// `deno task build:native` chose for build/native: that library must hold the real backend.
Deno.test("build/cuda, where CI built it, has the CUDA backend: exported ABI only, CUDA's own probe reason", async () => {
  const cudaLib = `${root}build/cuda/libkvrelay.so`;
  if (!(await Deno.stat(cudaLib).then(() => true, () => false))) {
    console.log("skipped: no build/cuda/libkvrelay.so (CI builds it where nvcc exists)");
    return;
  }
  const names = (await run("nm", ["-D", "--defined-only", cudaLib])).split("\n")
    .filter((l) => l.trim()).map((l) => l.trim().split(/\s+/).pop()!);
  assert.deepEqual(names.filter((n) => !n.startsWith("kvr_")), []);
  assert.match(await run("objdump", ["-h", cudaLib]), /nv_fatbin/);
  const { openNativeLibrary } = await import("../lib/native/library.ts");
  const info = new Uint8Array(512);
  const st = openNativeLibrary(cudaLib).symbols.kvr_backend_probe(1, 0, info, 512n);
  if (st === 0) return; // a GPU answers: scripts/gpu_check.sh covers that machine
  const text = new TextDecoder().decode(info.subarray(0, info.indexOf(0)));
  assert.match(text, /^no CUDA device: cuda[A-Za-z]+ \(\d+\): /);
});
