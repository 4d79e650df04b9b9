// openNativeLibrary: the project's only Deno.dlopen. Resolves the library path (argument, env
// KVRELAY_LIB, <repo>/build/native/libkvrelay.so), checks kvr_abi_version, memoizes per path,
// and turns C strings/status codes into JS values. No argument validation of engine calls here.

import { ABI_VERSION } from "./abi.ts";
import { EngineError } from "./errors.ts";
import { type KvrSymbols, symbols } from "./symbols.ts";

const DEFAULT_PATH = new URL("../../build/native/libkvrelay.so", import.meta.url).pathname;

/** An opened libkvrelay (memoized per path; never closed). */
export class NativeLibrary {
  /** the path passed to dlopen */
  readonly path: string;
  /** kvr_abi_version() of the opened library */
  readonly abiVersion: number;
  /** @internal raw FFI functions; use the typed wrappers in lib/native instead */
  readonly symbols: KvrSymbols;

  /** @internal use openNativeLibrary */
  constructor(path: string, lib: Deno.DynamicLibrary<typeof symbols>) {
    this.path = path;
    this.symbols = lib.symbols;
    this.abiVersion = lib.symbols.kvr_abi_version();
  }

  /** @internal thread-local kvr_last_error() of the calling (JS) thread */
  lastError(): string {
    return cString(this.symbols.kvr_last_error());
  }

  /** @internal throws EngineError(status, kvr_last_error()) when status != 0 */
  check(status: number, call: string): void {
    if (status !== 0) throw new EngineError(status, this.lastError(), call);
  }
}

/** Reads a NUL-terminated C string ("" for NULL). */
export function cString(ptr: Deno.PointerValue): string {
  return ptr === null ? "" : Deno.UnsafePointerView.getCString(ptr);
}

const opened = new Map<string, NativeLibrary>();

/**
 * libgomp reads OMP_WAIT_POLICY once, when the library loads. Its default spin-waits between
 * parallel regions, which on shared or oversubscribed machines (several sequences computing at
 * once, each with all cores) made prefill 3–15× slower than one thread; passive waiting keeps
 * timings steady. An explicit setting by the user wins.
 */
function useQuietOpenMpThreads(): void {
  try {
    if (Deno.env.get("OMP_WAIT_POLICY") === undefined) Deno.env.set("OMP_WAIT_POLICY", "passive");
  } catch {
    // no --allow-env: keep libgomp's default
  }
}

/**
 * Opens libkvrelay: `path`, else env KVRELAY_LIB, else <repo>/build/native/libkvrelay.so.
 * Memoized per path.
 * @param path explicit library path
 * @returns the opened library
 * @throws Error listing the path(s) tried and the build command when dlopen fails, or when the
 *   library's ABI version is not the one this binding expects
 */
export function openNativeLibrary(path?: string): NativeLibrary {
  const tried: string[] = [];
  let env: string | undefined;
  try {
    env = Deno.env.get("KVRELAY_LIB") || undefined;
  } catch {
    env = undefined; // no --allow-env: fall back to the default path
  }
  const candidate = path ?? env ?? DEFAULT_PATH;
  const source = path !== undefined ? "argument" : env !== undefined ? "KVRELAY_LIB" : "default";
  const memo = opened.get(candidate);
  if (memo) return memo;
  tried.push(`${candidate} (${source})`);
  let lib: Deno.DynamicLibrary<typeof symbols>;
  useQuietOpenMpThreads();
  try {
    lib = Deno.dlopen(candidate, symbols);
  } catch (e) {
    throw new Error(
      `cannot open libkvrelay: tried ${tried.join(", ")}: ${(e as Error).message}. ` +
        "Build it with `deno task build:native` (or point KVRELAY_LIB at a built libkvrelay.so).",
    );
  }
  const native = new NativeLibrary(candidate, lib);
  if (native.abiVersion !== ABI_VERSION) {
    lib.close();
    throw new Error(
      `${candidate}: kvr_abi_version() is ${native.abiVersion}, this binding needs ${ABI_VERSION}; ` +
        "rebuild with `deno task build:native --force`",
    );
  }
  opened.set(candidate, native);
  return native;
}
