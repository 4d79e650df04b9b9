// Backend probing and `auto` resolution: asks libkvrelay (kvr_backend_probe) whether a compute
// backend can run on a device and turns "auto" into CUDA when the probe succeeds, else CPU with
// the probe's reason. No model loading here (model.ts), no logging (callers log the reason once).

import { BACKEND_CODE, STATUS_NAMES } from "./abi.ts";
import { checkInt } from "./check.ts";
import type { NativeBackend } from "./layout.ts";
import { type NativeLibrary, openNativeLibrary } from "./library.ts";

/** A backend choice as configured: a concrete backend or "auto". */
export type BackendChoice = NativeBackend | "auto";

/** The backend choices, for config schemas and CLI checks. */
export const BACKEND_CHOICES: readonly BackendChoice[] = ["auto", "cpu", "cuda"];

/** kvr_backend_probe's answer. */
export interface BackendProbe {
  backend: NativeBackend;
  device: number;
  /** true when the backend can run models on the device */
  ok: boolean;
  /** kvr_status name ("OK", "UNSUPPORTED", ...) */
  status: string;
  /** one-line device description when ok, else the reason */
  info: string;
}

const INFO_BYTES = 512;

/**
 * Probes a backend on a device.
 * @param backend "cpu" or "cuda"
 * @param device device ordinal (0 for the CPU)
 * @param lib library (default openNativeLibrary())
 * @returns the probe's answer (never throws for an unusable device)
 * @throws TypeError for an unknown backend; RangeError for a device outside 0..2^31-1
 */
export function probeBackend(
  backend: NativeBackend,
  device = 0,
  lib: NativeLibrary = openNativeLibrary(),
): BackendProbe {
  if (!(backend in BACKEND_CODE)) {
    throw new TypeError(`backend must be "cpu" or "cuda", got ${JSON.stringify(backend)}`);
  }
  checkInt("device", device, 0, 0x7fffffff);
  const buf = new Uint8Array(INFO_BYTES);
  const st = lib.symbols.kvr_backend_probe(BACKEND_CODE[backend], device, buf, BigInt(buf.length));
  return {
    backend,
    device,
    ok: st === 0,
    status: STATUS_NAMES[st] ?? `status ${st}`,
    info: cString(buf),
  };
}

/** A resolved backend: what a tier will load its models on. */
export interface ResolvedBackend {
  backend: NativeBackend;
  device: number;
  /** the device's one-line description (from the probe) */
  info: string;
  /** set when "auto" fell back to the CPU: why CUDA was not used */
  fallbackReason?: string;
}

/**
 * Resolves a configured backend: "auto" = CUDA when its probe succeeds, else the CPU (with the
 * CUDA probe's reason in fallbackReason); "cpu"/"cuda" must probe OK.
 * @param choice "auto", "cpu" or "cuda"
 * @param device device ordinal (CUDA; the CPU always uses 0)
 * @param lib library (default openNativeLibrary())
 * @returns the backend to load on
 * @throws BackendUnavailableError when an explicit backend's probe fails
 */
export function resolveBackend(
  choice: BackendChoice,
  device = 0,
  lib: NativeLibrary = openNativeLibrary(),
): ResolvedBackend {
  if (choice === "auto") {
    const cuda = probeBackend("cuda", device, lib);
    if (cuda.ok) return { backend: "cuda", device, info: cuda.info };
    const cpu = probeBackend("cpu", 0, lib);
    if (!cpu.ok) throw new BackendUnavailableError(cpu);
    return { backend: "cpu", device: 0, info: cpu.info, fallbackReason: cuda.info };
  }
  const probe = probeBackend(choice, choice === "cpu" ? 0 : device, lib);
  if (!probe.ok) throw new BackendUnavailableError(probe);
  return { backend: choice, device: probe.device, info: probe.info };
}

/** An explicitly configured backend cannot run here (the probe's status and reason). */
export class BackendUnavailableError extends Error {
  readonly probe: BackendProbe;
  constructor(probe: BackendProbe) {
    super(`backend ${probe.backend} (device ${probe.device}) is unavailable: ${probe.info}`);
    this.name = "BackendUnavailableError";
    this.probe = probe;
  }
}

let noted = false;

/**
 * How a CPU fallback of `auto` is worded: plain absence (a library built without CUDA, no device,
 * no driver) is the ordinary CPU-only case and reads as information; any other probe failure
 * keeps the probe's reason.
 * @param reason the CUDA probe's info
 * @returns e.g. "no CUDA device"
 */
export function autoFallbackWords(reason: string): string {
  if (/^built without CUDA support/.test(reason)) {
    return "library built without CUDA";
  }
  if (/^no CUDA device: (cudaErrorNoDevice|cudaErrorInsufficientDriver)\b/.test(reason)) {
    return "no CUDA device";
  }
  return `CUDA unavailable: ${reason}`;
}

/**
 * Logs (stderr, once per process) that "auto" fell back to the CPU, with the CUDA probe's reason.
 * @param reason the CUDA probe's info
 * @returns true when this call logged, false when an earlier one had
 */
export function noteAutoFallback(reason: string): boolean {
  if (noted) return false;
  noted = true;
  console.error(`kvrelay: backend auto → cpu (${autoFallbackWords(reason)})`);
  return true;
}

/** The NUL-terminated string at the start of buf. */
export function cString(buf: Uint8Array): string {
  const end = buf.indexOf(0);
  return new TextDecoder().decode(end < 0 ? buf : buf.subarray(0, end));
}
