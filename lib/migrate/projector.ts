// A loaded projector, either kind, behind one interface: project a source cache block into a
// target cache block at the same positions. Loading checks the artifact against the two models'
// fingerprints and geometry (typed refusal on mismatch). Not the migration flow (migrate.ts).

import type { ModelConfig } from "../model/mod.ts";
import type { NativeLibrary, NativeSequence } from "../native/mod.ts";
import {
  denseWeights,
  geometryMismatch,
  type ProjectorMeta,
  readLinearWeights,
  readProjectorMeta,
} from "./artifact.ts";
import { MigrationRefusedError } from "./errors.ts";
import { type CacheBlock, LinearKernel } from "./native.ts";
import { OnnxKernel } from "./onnx.ts";

/** A model as migration sees it: fingerprints and config. */
export interface MigrationEndpoint {
  /** model name (for messages) */
  name: string;
  /** model fingerprint (lib/model) */
  fingerprint: string;
  /** tokenizer fingerprint (lib/tokenizer) */
  tokenizerFingerprint: string;
  config: ModelConfig;
}

/** A loaded projector. */
export interface Projector {
  readonly dir: string;
  readonly meta: ProjectorMeta;
  /**
   * Projects a source cache block to the target model's cache block.
   * @param startPos position of the block's first token
   * @param src (src layers, kv_heads, tokens, head_dim) f32, keys post-RoPE
   * @returns (tgt layers, kv_heads, tokens, head_dim) f32, keys post-RoPE
   */
  project(startPos: number, src: CacheBlock, threads?: number): Promise<CacheBlock>;
  /**
   * Projects positions [0, count) of a source sequence straight into an empty target sequence
   * (native memory, no JS copies) and sets its length to count. Present for the linear kind;
   * kinds without it (onnx, whose graph runs in JS) go through project() and f32 blocks.
   * @param src source model's sequence (length >= count)
   * @param dst empty target model's sequence (capacity >= count)
   * @param count tokens (>= 1)
   * @param threads worker threads (0 = all cores)
   */
  projectInto?(
    src: NativeSequence,
    dst: NativeSequence,
    count: number,
    threads?: number,
  ): Promise<void>;
  /** Releases native memory / the ONNX session. */
  free(): Promise<void>;
}

/**
 * Refuses a projector that does not belong to this pair: tokenizer, model fingerprints,
 * geometry.
 * @param meta projector metadata
 * @param source the source model
 * @param target the target model
 * @throws MigrationRefusedError with reason tokenizer_mismatch, source_mismatch,
 *   target_mismatch or geometry_mismatch
 */
export function checkProjectorPair(
  meta: ProjectorMeta,
  source: MigrationEndpoint,
  target: MigrationEndpoint,
): void {
  if (source.tokenizerFingerprint !== target.tokenizerFingerprint) {
    throw new MigrationRefusedError(
      "tokenizer_mismatch",
      `${source.name} tokenizer ${
        source.tokenizerFingerprint.slice(0, 12)
      }… != ${target.name} tokenizer ${target.tokenizerFingerprint.slice(0, 12)}…`,
    );
  }
  if (meta.tokenizer_fingerprint !== source.tokenizerFingerprint) {
    throw new MigrationRefusedError(
      "tokenizer_mismatch",
      `projector was fitted for tokenizer ${meta.tokenizer_fingerprint.slice(0, 12)}…, models use ${
        source.tokenizerFingerprint.slice(0, 12)
      }…`,
    );
  }
  if (meta.source.fingerprint !== source.fingerprint) {
    throw new MigrationRefusedError(
      "source_mismatch",
      `projector source is ${meta.source.name} (${
        meta.source.fingerprint.slice(0, 12)
      }…), got ${source.name} (${source.fingerprint.slice(0, 12)}…)`,
    );
  }
  if (meta.target.fingerprint !== target.fingerprint) {
    throw new MigrationRefusedError(
      "target_mismatch",
      `projector target is ${meta.target.name} (${
        meta.target.fingerprint.slice(0, 12)
      }…), got ${target.name} (${target.fingerprint.slice(0, 12)}…)`,
    );
  }
  const gs = geometryMismatch(meta.source, source.config),
    gt = geometryMismatch(meta.target, target.config);
  if (gs || gt) {
    throw new MigrationRefusedError("geometry_mismatch", gs ? `source ${gs}` : `target ${gt}`);
  }
}

/**
 * Loads a projector directory for a given pair (checked with checkProjectorPair first).
 * @param dir projector directory (projector.json + weights.safetensors or an .onnx file)
 * @param source source model
 * @param target target model
 * @param lib native library (default openNativeLibrary())
 * @returns the projector
 * @throws ProjectorFormatError for a bad artifact; MigrationRefusedError for a pair mismatch
 */
export async function loadProjector(
  dir: string,
  source: MigrationEndpoint,
  target: MigrationEndpoint,
  lib?: NativeLibrary,
): Promise<Projector> {
  const meta = await readProjectorMeta(dir);
  checkProjectorPair(meta, source, target);
  if (meta.kind === "linear") {
    const d = denseWeights(meta, await readLinearWeights(dir, meta));
    const kernel = new LinearKernel(source.config, target.config, d.wk, d.bk, d.wv, d.bv, lib);
    return {
      dir,
      meta,
      project: (startPos, src, threads) => kernel.apply(startPos, src, threads),
      projectInto: (src, dst, count, threads) => kernel.applySeq(src, dst, count, threads),
      free: () => Promise.resolve(kernel.free()),
    };
  }
  const kernel = await OnnxKernel.open(dir, meta, source.config, target.config, lib);
  return {
    dir,
    meta,
    project: (startPos, src) => kernel.apply(startPos, src),
    free: () => kernel.free(),
  };
}

/** A projector directory found on disk with its validated metadata. */
export interface ProjectorEntry {
  dir: string;
  meta: ProjectorMeta;
}

/**
 * Lists the projector directories under a root (e.g. models/projectors): every subdirectory with
 * a projector.json. Invalid ones are reported, not thrown, so one bad artifact cannot hide the rest.
 * @param root directory holding one subdirectory per projector
 * @returns valid entries (sorted by directory) and per-directory errors
 * @throws Deno.errors.NotFound when root does not exist
 */
export async function discoverProjectors(
  root: string,
): Promise<{ projectors: ProjectorEntry[]; errors: { dir: string; message: string }[] }> {
  const projectors: ProjectorEntry[] = [], errors: { dir: string; message: string }[] = [];
  for await (const e of Deno.readDir(root)) {
    if (!e.isDirectory) continue;
    const dir = `${root}/${e.name}`;
    try {
      await Deno.stat(`${dir}/projector.json`);
    } catch {
      continue;
    }
    try {
      projectors.push({ dir, meta: await readProjectorMeta(dir) });
    } catch (err) {
      errors.push({ dir, message: (err as Error).message });
    }
  }
  projectors.sort((a, b) => a.dir.localeCompare(b.dir));
  return { projectors, errors };
}

/**
 * Picks the projector for a pair: fingerprints and tokenizer must match; among several, the one
 * with the highest stored kl_recovered at its repair_default (unmeasured ones last).
 * @param entries from discoverProjectors
 * @param source source model
 * @param target target model
 * @returns the entry, or null when none fits
 */
export function findProjector(
  entries: ProjectorEntry[],
  source: MigrationEndpoint,
  target: MigrationEndpoint,
): ProjectorEntry | null {
  const score = (m: ProjectorMeta) =>
    m.quality?.repair[String(m.repair_default)]?.kl_recovered ?? -Infinity;
  const fits = entries.filter((e) => {
    try {
      checkProjectorPair(e.meta, source, target);
      return true;
    } catch {
      return false;
    }
  });
  fits.sort((a, b) => score(b.meta) - score(a.meta));
  return fits[0] ?? null;
}
