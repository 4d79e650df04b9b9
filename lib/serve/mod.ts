// Public face of lib/serve, the serving core: the runtime (loaded tiers, store, router, migrator,
// metrics), admission to a tier's capacity under the request deadline (slot.ts: the one place a
// request acquires engine capacity), generations (generation.ts: the one place a decode loop
// runs), snapshot handoff and migration orchestration, and the domain errors they throw.
// No HTTP: functions/ owns routes, request schemas and the mapping of these errors to statuses.

export {
  BusyError,
  InputError,
  type InputErrorCode,
  NonFiniteLogitsError,
  NotFoundError,
  SnapshotMismatchError,
  TooLargeError,
  UnavailableError,
  type UnavailableReason,
} from "./errors.ts";
export { Counter, Gauge, Histogram, Metrics } from "./metrics.ts";
export { ModelQueue, QueueFullError } from "./queue.ts";
export { type Ticket, WaitGate } from "./wait_gate.ts";
export { findTier, type Tier, type TierSampling, tierSampling } from "./tier.ts";
export { type RequestContext, tenantId } from "./request.ts";
export { BodyBudget, type BodyHold } from "./uploads.ts";
export {
  bodyDeadline,
  type BodyTier,
  bodyWithin,
  deadlineSignal,
  type GuardedBody,
  WRITE_GRACE_MS,
  writeWithin,
} from "./deadline.ts";
export { autoFallbackNote, resolveTierBackends, TierBackendError } from "./backends.ts";
export {
  derivedKvPoolMb,
  kvBlockBytes,
  type KvGeometry,
  minKvPoolMb,
  preflightProblems,
} from "./preflight.ts";
export {
  createMigrator,
  type GateResult,
  type Migrator,
  projectorPartProblems,
} from "./migrator.ts";
export {
  createRuntime,
  requireReady,
  requireTier,
  type Runtime,
  type RuntimeOptions,
  type StartupReport,
  type TierLoadState,
} from "./runtime.ts";
export { type AbortCause, admitSlot, type Slot } from "./slot.ts";
export {
  ScheduledSequence,
  Scheduler,
  SchedulerClosedError,
  type SchedulerCounters,
  type SchedulerHooks,
  type SchedulerOptions,
  type StepEngine,
  type StepItem,
  type StepStats,
} from "./scheduler.ts";
export { type NativeScheduler, nativeStepEngine } from "./native_engine.ts";
export { createBatching, poolBlocks } from "./batching.ts";
export { Lane } from "./lane.ts";
export {
  abortError,
  type CacheOutcome,
  checkContext,
  Generation,
  type GenerationRequest,
  type ServedResult,
  startGeneration,
  withCacheTemperature,
} from "./generation.ts";
export {
  type DecodeOrigin,
  decodeOrigin,
  type SnapshotGenerationRequest,
  startFromSnapshot,
} from "./from_snapshot.ts";
export {
  countBytes,
  loadStored,
  peekHeader,
  peekStream,
  readBounded,
  receiveUpload,
  snapshotKey,
  streamTimer,
  type StreamTiming,
  tierNameOfModel,
  tierOfSnapshot,
  timingHeader,
  untilAborted,
  type Upload,
} from "./handoff.ts";
export {
  type MigratedSnapshot,
  migrateSnapshot,
  type MigrationEmptyReason,
  prefillSnapshot,
  storeSnapshot,
} from "./export.ts";
export {
  type ChatMessage,
  chatPrompt,
  checkTextBound,
  messageText,
  promptChars,
  promptIds,
  type PromptInput,
} from "./prompt.ts";
