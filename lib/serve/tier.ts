// One served tier at run time: its config, loaded model, admission, prefix cache and
// snapshot encoding. A type plus the lookup by name; loading tiers is runtime.ts's job.
import type { TierConfig } from "../config/mod.ts";
import type { LoadedModel } from "../engine/mod.ts";
import type { KvPool, NativeSequence } from "../native/mod.ts";
import type { BlockCache } from "./block_cache.ts";
import type { NativeScheduler } from "./native_engine.ts";
import type { SnapshotEncoding } from "../snapshot/mod.ts";
import type { PrefixCache } from "../store/mod.ts";
import { NotFoundError } from "./errors.ts";
import type { ModelQueue } from "./queue.ts";
import type { WaitGate } from "./wait_gate.ts";

/** One served tier. */
export interface Tier {
  name: string;
  /** 0 = lowest tier. */
  rank: number;
  config: TierConfig;
  model: LoadedModel;
  /** The slot queue of a tier without batching (`concurrency` running, `queue_depth` waiting);
   *  null when the tier batches (admission by KV blocks, its line bounded by `batch.gate`). */
  queue: ModelQueue | null;
  /** Null when the prefix cache is disabled. */
  prefix: PrefixCache | null;
  /** Snapshot encoding this tier exports with (undefined = the cache's own dtype). */
  encoding: SnapshotEncoding | undefined;
  /** Continuous batching: the paged KV pool and the step loop generations decode in (null when
   *  the tier config turns batching off: each generation then decodes alone). */
  batch: {
    pool: KvPool;
    scheduler: NativeScheduler;
    /** Sets the KV block gauges from the pool and lets a waiting block reservation go ahead
     *  (after a sequence gave its blocks back). */
    refresh(): void;
    /** How many admitted requests may wait for the scheduler (`queue_depth`). */
    gate: WaitGate;
    /** The prefix cache inside the pool (used when the tier's prefix cache is enabled). */
    cache: BlockCache;
    /** Sequences whose partial last block another sequence shares (forks before their first
     *  write): their next write copies that block, which the scheduler counts as a block needed. */
    sharedTail: WeakSet<NativeSequence>;
  } | null;
}

/** Sampling defaults of a tier (the snake_case fields of generation_config.json). */
export type TierSampling = LoadedModel["samplingDefaults"];

/**
 * A tier's sampling defaults: its model's generation_config.json, each field the tier's
 * `sampling` config gives overriding the model's (requests override both).
 * @param tier the tier
 * @returns the merged fields; absent ones are left to the engine's defaults
 */
export function tierSampling(tier: Pick<Tier, "config" | "model">): TierSampling {
  const out: TierSampling = { ...tier.model.samplingDefaults };
  for (const [k, v] of Object.entries(tier.config.sampling) as [keyof TierSampling, number][]) {
    if (v !== undefined) out[k] = v;
  }
  return out;
}

/**
 * The tier named `name` among loaded tiers.
 * @param tiers loaded tiers by name
 * @param name the tier name
 * @param param request field that named it (quoted in the error)
 * @returns the tier
 * @throws {NotFoundError} when no tier has that name (own keys only)
 */
export function findTier(tiers: ReadonlyMap<string, Tier>, name: string, param = "tier"): Tier {
  const t = tiers.get(name);
  if (!t) {
    throw new NotFoundError(
      `unknown tier "${name}"; available: ${[...tiers.keys()].join(", ")}`,
      param,
    );
  }
  return t;
}
