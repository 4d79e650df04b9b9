// openTestLibrary: the test library, libkvrelay_test.so — the production library's objects plus
// the test exports of native/include/kvrelay_test.h (kernel entry points, benchmarks, debug and
// code-path switches). Tests and benchmarks open it; serving code opens only libkvrelay.so
// (library.ts). Resolved from KVRELAY_TEST_LIB, else beside KVRELAY_LIB's library, else
// <repo>/build/native/libkvrelay_test.so.

import { ABI_VERSION } from "./abi.ts";
import { NativeLibrary } from "./library.ts";
import { symbols } from "./symbols.ts";
import { testSymbols } from "./test_symbols.ts";

const allSymbols = { ...symbols, ...testSymbols } as const;

/** The dlopen'ed test hooks. */
export type TestSymbols = Deno.DynamicLibrary<typeof testSymbols>["symbols"];

/** The test library: every production entry point (`symbols`) plus the test hooks (`hooks`). */
export class TestLibrary extends NativeLibrary {
  /** @internal raw FFI test hooks (kvrelay_test.h) */
  readonly hooks: TestSymbols;

  /** @internal use openTestLibrary */
  constructor(path: string, lib: Deno.DynamicLibrary<typeof allSymbols>) {
    super(path, lib);
    this.hooks = lib.symbols;
  }
}

const DEFAULT_PATH = new URL("../../build/native/libkvrelay_test.so", import.meta.url).pathname;
const opened = new Map<string, TestLibrary>();

function env(name: string): string | undefined {
  try {
    return Deno.env.get(name) || undefined;
  } catch {
    return undefined; // no --allow-env
  }
}

/** Where the test library is: explicit, KVRELAY_TEST_LIB, beside KVRELAY_LIB, or the default. */
export function testLibraryPath(path?: string): string {
  if (path !== undefined) return path;
  const explicit = env("KVRELAY_TEST_LIB");
  if (explicit !== undefined) return explicit;
  const production = env("KVRELAY_LIB");
  if (production === undefined) return DEFAULT_PATH;
  const slash = production.lastIndexOf("/");
  return `${slash < 0 ? "." : production.slice(0, slash)}/libkvrelay_test.so`;
}

/**
 * Opens libkvrelay_test.so (memoized per path).
 * @param path explicit library path
 * @returns the opened test library
 * @throws Error naming the path and the build command when dlopen fails, or on an ABI mismatch
 */
export function openTestLibrary(path?: string): TestLibrary {
  const candidate = testLibraryPath(path);
  const memo = opened.get(candidate);
  if (memo) return memo;
  let lib: Deno.DynamicLibrary<typeof allSymbols>;
  try {
    lib = Deno.dlopen(candidate, allSymbols);
  } catch (e) {
    throw new Error(
      `cannot open the test library ${candidate}: ${(e as Error).message}. ` +
        "Build it with `deno task build:native` (or point KVRELAY_TEST_LIB at a built one).",
    );
  }
  const t = new TestLibrary(candidate, lib);
  if (t.abiVersion !== ABI_VERSION) {
    lib.close();
    throw new Error(`${candidate}: kvr_abi_version() is ${t.abiVersion}, expected ${ABI_VERSION}`);
  }
  opened.set(candidate, t);
  return t;
}
