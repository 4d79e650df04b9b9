// lib/migrate: cross-model KV migration — projector artifacts (linear and onnx), fitting (native
// float64 ridge), applying a projector to live sequences with repair, evaluation, temperature
// scaling and the router's quality gate. No HTTP and no model loading policy.

export {
  type MigrationRefusalReason,
  MigrationRefusedError,
  OnnxRuntimeMissingError,
  ProjectorFormatError,
} from "./errors.ts";
export { loadOnnxRuntime } from "./onnx.ts";
export {
  denseWeights,
  geometryMismatch,
  type LayerMapEntry,
  type LayerWeights,
  type ModelRef,
  modelRef,
  parseProjectorMeta,
  type ProjectorMeta,
  projectorMetaSchema,
  type Quality,
  readLinearWeights,
  readProjectorMeta,
  type RepairMetrics,
  writeProjector,
} from "./artifact.ts";
export {
  type CacheBlock,
  featureWidth,
  kvFromFeatures,
  kvToFeatures,
  LinearKernel,
  readCacheBlock,
  RidgeAccumulator,
  type RidgeSolution,
  writeCacheBlock,
} from "./native.ts";
export {
  checkProjectorPair,
  discoverProjectors,
  findProjector,
  loadProjector,
  type MigrationEndpoint,
  type Projector,
  type ProjectorEntry,
} from "./projector.ts";
export {
  endpointOf,
  migrateAndRepair,
  type MigrateAndRepairOptions,
  type MigrateAndRepairResult,
  migrateKv,
  type MigrateKvOptions,
  type MigrationMode,
  migrationMode,
} from "./migrate.ts";
export { type EvalOptions, type EvalResult, evaluateMigration, qualityRecord } from "./evaluate.ts";
export { fitLinearProjector, type FitOptions, type FitResult, LAMBDA_GRID } from "./fit.ts";
export {
  applyTemperature,
  fitTemperature,
  klDivergence,
  logSoftmaxRow,
  meanNllAt,
} from "./temperature.ts";
export { type GateDecision, type GatePair, type GateThresholds, migrationGate } from "./gate.ts";
