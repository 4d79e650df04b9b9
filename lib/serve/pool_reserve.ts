// Admission of KV written straight into a tier's pool (a snapshot import, a projection), outside
// the scheduler's steps: the blocks it will take are held back first, waiting under the request's
// signal as a prompt waits for its prefill; a pool that still runs out meanwhile answers as a full
// queue does (429 + Retry-After), never with a crash. Not the scheduler (scheduler.ts).
import { EngineError } from "../native/mod.ts";
import { QueueFullError } from "./queue.ts";
import type { BlockReservation } from "./scheduler.ts";
import type { Tier } from "./tier.ts";

/**
 * Holds back the blocks a sequence of `tokens` positions takes in `tier`'s pool.
 * @param tier the tier
 * @param tokens positions the sequence will hold before it is attached
 * @param signal the request's signal (deadline, client, shutdown): stops the wait
 * @returns the reservation (release it once the KV is written, or on failure), or null when the
 *   tier does not batch (its sequences are its own) or nothing is needed
 * @throws SchedulerClosedError when stopped or on shutdown; RangeError when the pool could never
 *   hold them
 */
export async function reservePoolBlocks(
  tier: Tier,
  tokens: number,
  signal?: AbortSignal,
): Promise<BlockReservation | null> {
  const batch = tier.batch;
  if (!batch || tokens <= 0) return null;
  return await batch.scheduler.reserveBlocks(Math.ceil(tokens / batch.pool.blockTokens), signal);
}

/**
 * The error of a write into the pool that found too few free blocks: a {@link QueueFullError}
 * (nothing was kept; the client retries), else `e` unchanged.
 * @param tier the tier whose pool it was
 * @param e the error
 * @returns the error to throw
 */
export function poolFullError(tier: Tier, e: unknown): unknown {
  if (e instanceof EngineError && e.codeName === "POOL_EXHAUSTED") {
    return new QueueFullError(tier.name, 1);
  }
  return e;
}
