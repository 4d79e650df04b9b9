// The migration gate for the router: migrate only where the projector's stored, measured quality
// clears the tier's thresholds and the pair matches; otherwise a typed refusal (reason + message)
// that the caller turns into a full prefill. Pure function of metadata; runs no model.

import type { ProjectorMeta } from "./artifact.ts";
import type { MigrationRefusalReason } from "./errors.ts";

/** Per-tier minimum quality (each optional; unset = not checked). */
export interface GateThresholds {
  /** minimum kl_recovered at the chosen repair length */
  minKlRecovered?: number;
  /** minimum top-1 agreement with full prefill */
  minTop1Agreement?: number;
  /** minimum NLL gap recovered */
  minRecovered?: number;
  /** repair length to judge (default: the projector's repair_default; must have been measured) */
  repair?: number;
}

/** The pair a request would migrate between (fingerprints), checked against the projector. */
export interface GatePair {
  sourceFingerprint: string;
  targetFingerprint: string;
  sourceTokenizer: string;
  targetTokenizer: string;
}

/** Gate verdict. */
export type GateDecision =
  | { allow: true; mode: "copy" | "project"; repair: number; temperature: number }
  | { allow: false; reason: MigrationRefusalReason; message: string };

function refuse(reason: MigrationRefusalReason, message: string): GateDecision {
  return { allow: false, reason, message };
}

/**
 * Decides whether a request may migrate.
 * @param projectorMeta the pair's projector metadata, or null when there is none
 * @param thresholds the tier's minimum quality
 * @param pair optional fingerprints of the live pair: same model → allow "copy" (no projector
 *   needed); tokenizer or fingerprint mismatch → refusal
 * @returns allow (mode, repair length, temperature to apply) or refuse (reason, message)
 * @throws RangeError when a threshold is not a finite number
 */
export function migrationGate(
  projectorMeta: ProjectorMeta | null,
  thresholds: GateThresholds,
  pair?: GatePair,
): GateDecision {
  for (const [k, v] of Object.entries(thresholds)) {
    if (v !== undefined && (typeof v !== "number" || !Number.isFinite(v))) {
      throw new RangeError(`threshold ${k} must be a finite number, got ${JSON.stringify(v)}`);
    }
  }
  if (pair) {
    if (pair.sourceTokenizer !== pair.targetTokenizer) {
      return refuse(
        "tokenizer_mismatch",
        `tokenizers differ (${pair.sourceTokenizer.slice(0, 12)}… vs ${
          pair.targetTokenizer.slice(0, 12)
        }…)`,
      );
    }
    if (pair.sourceFingerprint === pair.targetFingerprint) {
      return { allow: true, mode: "copy", repair: thresholds.repair ?? 1, temperature: 1 };
    }
  }
  if (projectorMeta === null) return refuse("no_projector", "no projector for this pair");
  if (pair) {
    if (projectorMeta.tokenizer_fingerprint !== pair.sourceTokenizer) {
      return refuse(
        "tokenizer_mismatch",
        `projector tokenizer ${
          projectorMeta.tokenizer_fingerprint.slice(0, 12)
        }… differs from the models'`,
      );
    }
    if (projectorMeta.source.fingerprint !== pair.sourceFingerprint) {
      return refuse(
        "source_mismatch",
        `projector source ${projectorMeta.source.name} has another fingerprint`,
      );
    }
    if (projectorMeta.target.fingerprint !== pair.targetFingerprint) {
      return refuse(
        "target_mismatch",
        `projector target ${projectorMeta.target.name} has another fingerprint`,
      );
    }
  }
  const q = projectorMeta.quality;
  if (q === null) {
    return refuse(
      "no_quality",
      `projector ${projectorMeta.source.name}→${projectorMeta.target.name} has no measured quality`,
    );
  }
  const r = thresholds.repair ?? projectorMeta.repair_default;
  const m = q.repair[String(r)];
  if (m === undefined) {
    return refuse(
      "no_quality",
      `quality was not measured at repair ${r} (measured: ${Object.keys(q.repair).join(", ")})`,
    );
  }
  const checks: [keyof GateThresholds, number, string][] = [
    ["minKlRecovered", m.kl_recovered, "kl_recovered"],
    ["minTop1Agreement", m.top1_agreement, "top1_agreement"],
    ["minRecovered", m.recovered, "recovered"],
  ];
  for (const [key, value, name] of checks) {
    const min = thresholds[key];
    if (min !== undefined && !(value >= min)) {
      return refuse(
        "quality_below_threshold",
        `${name} ${value.toFixed(4)} at repair ${r} < threshold ${min}`,
      );
    }
  }
  return { allow: true, mode: "project", repair: r, temperature: projectorMeta.temperature ?? 1 };
}
