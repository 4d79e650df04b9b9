// The serving side of cross-tier KV migration: loads the configured projectors (lib/migrate),
// gates each tier pair on the projector's stored, measured quality against the tier's threshold
// (lib/migrate migrationGate), and moves KV between live sequences (migrateKv: exact copy for the
// same model, projection otherwise). A refused pair is a reason string; callers fall back to a
// full prefill (generate) or refuse (migrate, decode). The projection math is lib/migrate's.
// Depends on tier.ts only (not runtime.ts): the runtime owns a migrator, not the reverse.
import type { KvrelayConfig, ProjectorConfig } from "../config/mod.ts";
import type { NativeSequence } from "../native/mod.ts";
import {
  endpointOf,
  loadOnnxRuntime,
  loadProjector,
  migrateKv,
  migrationGate,
  type MigrationRefusalReason,
  MigrationRefusedError,
  OnnxRuntimeMissingError,
  type Projector,
  readProjectorMeta,
} from "../migrate/mod.ts";
import type { Tier } from "./tier.ts";

/** Outcome of the gate for one pair. */
export type GateResult =
  | { ok: true; repairTokens: number; mode: "copy" | "project"; temperature: number }
  | { ok: false; code: MigrationRefusalReason; reason: string };

/** Gates and runs migrations between loaded tiers. */
export interface Migrator {
  /** Loads configured projectors against the loaded tiers (called once by Runtime.load). */
  load(tiers: ReadonlyMap<string, Tier>): Promise<void>;
  /**
   * Whether `from`'s cache may be migrated into `to`.
   * @returns ok with the repair length, or the refusal reason
   */
  gate(from: Tier, to: Tier): GateResult;
  /**
   * Moves positions [0, n) of `source` (a sequence of `from`) into the empty sequence
   * `target` of `to`, leaving target.length = n (the caller then repairs: prefills the rest).
   * @throws {MigrationRefusedError} when the gate refuses; RangeError when target is too small
   */
  projectInto(
    from: Tier,
    to: Tier,
    source: NativeSequence,
    n: number,
    target: NativeSequence,
  ): Promise<void>;
  /** Frees loaded projectors. */
  close(): Promise<void>;
}

/**
 * Checks that every configured projector's kind can run in this process: an `onnx` projector
 * needs the optional onnxruntime-node part (left out of images unless built with KVRELAY_ONNX=1). Run
 * before serving, so a deployment without the part refuses to start instead of silently never
 * migrating that pair.
 * A projector whose metadata does not read is left to `Migrator.load` (it disables the pair).
 * @param config the deployment config (projector paths resolved)
 * @param loadOnnx loads the ONNX part (tests replace it)
 * @returns one "projectors.<i>.path: ..." line per problem (empty when all is well)
 */
export async function projectorPartProblems(
  config: KvrelayConfig,
  loadOnnx: () => Promise<unknown> = loadOnnxRuntime,
): Promise<string[]> {
  const problems: string[] = [];
  for (const [i, p] of config.projectors.entries()) {
    let kind: string;
    try {
      kind = (await readProjectorMeta(p.path)).kind;
    } catch {
      continue;
    }
    if (kind !== "onnx") continue;
    try {
      await loadOnnx();
    } catch (e) {
      if (!(e instanceof OnnxRuntimeMissingError)) throw e;
      problems.push(`projectors.${i}.path: ${p.path} is an onnx projector: ${e.message}`);
    }
  }
  return problems;
}

/**
 * Builds the migrator of a config. Same-model pairs copy KV exactly; other pairs need a
 * configured projector that loads for the pair and whose stored kl_recovered clears
 * `min_quality` at its repair length.
 * @param config the deployment config
 * @returns the migrator
 */
export function createMigrator(config: KvrelayConfig): Migrator {
  const byPair = new Map<string, ProjectorConfig>();
  for (const p of config.projectors) byPair.set(`${p.from}\0${p.to}`, p);
  const loaded = new Map<string, Projector>();
  const loadErrors = new Map<string, string>();
  return {
    async load(tiers: ReadonlyMap<string, Tier>): Promise<void> {
      // Concurrently: their file reads overlap (part of every cold start).
      await Promise.all(config.projectors.map(async (p) => {
        const from = tiers.get(p.from)!, to = tiers.get(p.to)!;
        const key = `${p.from}\0${p.to}`;
        try {
          loaded.set(
            key,
            await loadProjector(p.path, endpointOf(from.model), endpointOf(to.model)),
          );
        } catch (e) {
          // A projector that does not load only disables migration for its pair.
          const msg = `projector ${p.path} not loaded: ${(e as Error).message}`;
          loadErrors.set(key, msg);
          console.warn(`kvrelay: ${msg}`);
        }
      }));
    },
    gate(from: Tier, to: Tier): GateResult {
      const key = `${from.name}\0${to.name}`;
      const cfg = byPair.get(key);
      const projector = loaded.get(key) ?? null;
      const pair = {
        sourceFingerprint: from.model.fingerprint,
        targetFingerprint: to.model.fingerprint,
        sourceTokenizer: from.model.tokenizer.fingerprint,
        targetTokenizer: to.model.tokenizer.fingerprint,
      };
      if (projector === null && from.model.fingerprint !== to.model.fingerprint) {
        if (loadErrors.has(key)) {
          return { ok: false, code: "no_projector", reason: loadErrors.get(key)! };
        }
        if (!cfg) {
          return {
            ok: false,
            code: "no_projector",
            reason: `no projector configured from "${from.name}" to "${to.name}"`,
          };
        }
      }
      const d = migrationGate(projector?.meta ?? null, {
        minKlRecovered: cfg?.min_quality,
        repair: cfg?.repair_tokens,
      }, pair);
      if (!d.allow) return { ok: false, code: d.reason, reason: d.message };
      return { ok: true, repairTokens: d.repair, mode: d.mode, temperature: d.temperature };
    },
    async projectInto(from, to, source, n, target): Promise<void> {
      const g = this.gate(from, to);
      if (!g.ok) throw new MigrationRefusedError(g.code, g.reason);
      await migrateKv({
        source: endpointOf(from.model),
        sourceSeq: source,
        target: endpointOf(to.model),
        targetSeq: target,
        projector: loaded.get(`${from.name}\0${to.name}`) ?? null,
        count: n,
        threads: to.model.native.threads,
      });
    },
    async close(): Promise<void> {
      for (const p of loaded.values()) await p.free();
      loaded.clear();
    },
  };
}
