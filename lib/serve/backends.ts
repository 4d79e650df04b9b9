// Which compute backend each tier runs on: resolves every tier's configured `backend`/`device`
// with the library's probe before any model loads (so `backend: cuda` without a usable device
// refuses to start with the probe's reason), and words the one log line for tiers whose `auto`
// fell back to the CPU. No model loading (runtime.ts), no process exit (functions/shared/serve.ts).

import type { KvrelayConfig } from "../config/mod.ts";
import {
  autoFallbackWords,
  BackendUnavailableError,
  type NativeLibrary,
  resolveBackend,
  type ResolvedBackend,
} from "../native/mod.ts";

/** A tier's configured backend cannot run here. */
export class TierBackendError extends Error {
  /**
   * @param tier the tier's name
   * @param cause the probe's failure
   */
  constructor(readonly tier: string, override readonly cause: BackendUnavailableError) {
    super(`tier "${tier}": ${cause.message}`);
    this.name = "TierBackendError";
  }
}

/**
 * Resolves every tier's backend (in tier order).
 * @param config the deployment config
 * @param lib the native library (default: openNativeLibrary())
 * @returns tier name → resolved backend
 * @throws {TierBackendError} for the first tier whose explicit backend is unavailable
 */
export function resolveTierBackends(
  config: KvrelayConfig,
  lib?: NativeLibrary,
): Map<string, ResolvedBackend> {
  const out = new Map<string, ResolvedBackend>();
  for (const name of config.tierOrder) {
    const tc = config.tiers[name];
    try {
      out.set(name, resolveBackend(tc.backend, tc.device, lib));
    } catch (e) {
      if (e instanceof BackendUnavailableError) throw new TierBackendError(name, e);
      throw e;
    }
  }
  return out;
}

/**
 * The one log line for tiers whose `auto` fell back to the CPU, or null when none did.
 * @param resolved from resolveTierBackends
 * @returns e.g. `backend auto → cpu for tiers fast, balanced (no CUDA device)`
 */
export function autoFallbackNote(resolved: Map<string, ResolvedBackend>): string | null {
  const fell = [...resolved].filter(([, r]) => r.fallbackReason !== undefined);
  if (fell.length === 0) return null;
  const reasons = [...new Set(fell.map(([, r]) => autoFallbackWords(r.fallbackReason!)))].join(
    "; ",
  );
  const names = fell.map(([n]) => n).join(", ");
  return `backend auto → cpu for tier${fell.length > 1 ? "s" : ""} ${names} (${reasons})`;
}
