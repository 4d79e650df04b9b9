// A tier's continuous batching at run time: its paged KV pool sized from the tier's memory
// budget (kv_pool_mb, else derived from the model) and its Scheduler, with the scheduler's step statistics wired to the
// metrics (batch size histogram, KV blocks used/free, preemptions), the gate bounding how many
// admitted requests wait for it (wait_gate.ts), and the prefix cache inside the pool
// (block_cache.ts). Not the scheduler itself.

import type { TierConfig } from "../config/mod.ts";
import type { NativeModel, NativeSequence } from "../native/mod.ts";
import { BlockCache } from "./block_cache.ts";
import type { Metrics } from "./metrics.ts";
import { nativeStepEngine } from "./native_engine.ts";
import { derivedKvPoolMb, kvBlockBytes, minKvPoolMb } from "./preflight.ts";
import { Scheduler } from "./scheduler.ts";
import type { Tier } from "./tier.ts";
import { WaitGate } from "./wait_gate.ts";

/**
 * Blocks a pool of `mb` MiB holds for a model (each block: every layer's K and V for
 * `blockTokens` positions).
 * @param model the model
 * @param mb budget in MiB
 * @param blockTokens positions per block
 * @returns whole blocks within the budget
 */
export function poolBlocks(model: NativeModel, mb: number, blockTokens: number): number {
  return Math.floor((mb * 2 ** 20) / kvBlockBytes(model.config, model.kvDtype, blockTokens));
}

/**
 * Creates a tier's pool and scheduler.
 * @param name tier name (metric label, messages)
 * @param tc the tier config
 * @param model the tier's model
 * @param metrics where step statistics go
 * @returns the tier's `batch`
 * @throws RangeError when the budget cannot hold one max_context sequence
 */
export function createBatching(
  name: string,
  tc: TierConfig,
  model: NativeModel,
  metrics: Metrics,
): NonNullable<Tier["batch"]> {
  const bt = tc.kv_block_tokens;
  const mb = tc.kv_pool_mb ?? derivedKvPoolMb(model.config, tc);
  const blocks = poolBlocks(model, mb, bt);
  const need = Math.ceil(tc.max_context / bt);
  if (blocks < need) {
    throw new RangeError(
      `tier "${name}": kv_pool_mb ${mb} holds ${blocks} blocks of ${bt} tokens, fewer than one max_context (${tc.max_context}) sequence needs (${need}): set it to at least ${
        minKvPoolMb(model.config, tc)
      }`,
    );
  }
  const pool = model.createKvPool(blocks, bt);
  const labels = { tier: name };
  metrics.kvBlocksUsed.set(labels, 0);
  metrics.kvBlocksFree.set(labels, blocks);
  const cache = new BlockCache(pool);
  const sharedTail = new WeakSet<NativeSequence>();
  const scheduler = new Scheduler(
    nativeStepEngine(model, pool, {
      cache,
      sharedTail,
      reserved: (): number => scheduler.reservedBlocks,
    }),
    {
      maxBatch: tc.max_batch,
      maxStepTokens: tc.max_step_tokens,
      maxDecodeSteps: tc.max_decode_steps,
      burstMs: tc.decode_burst_ms,
    },
    {
      onStep(s) {
        metrics.batchSize.observe(labels, s.seqs);
        if (s.decodes > 0) metrics.stepTokens.inc({ ...labels, kind: "decode" }, s.decodes);
        if (s.prefillTokens > 0) {
          metrics.stepTokens.inc({ ...labels, kind: "prefill" }, s.prefillTokens);
        }
        refresh();
      },
      onPreempt() {
        metrics.preemptions.inc(labels);
      },
    },
  );
  // The pool's own counts (blocks the prefix cache holds count as used; the scheduler counts its
  // idle ones as free) and the cache's size.
  function refresh() {
    // A request still unwinding when the runtime closed frees its sequence after the pool.
    if (pool.freed) return;
    const free = pool.blocksFree;
    metrics.kvBlocksUsed.set(labels, blocks - free);
    metrics.kvBlocksFree.set(labels, free);
    metrics.prefixCachedBlocks.set(labels, cache.blocks);
    scheduler.blocksReleased();
  }
  const gate = new WaitGate(name, tc.queue_depth, (waiting) => {
    metrics.queueDepth.set(labels, waiting);
  });
  return { pool, scheduler, refresh, gate, cache, sharedTail };
}
