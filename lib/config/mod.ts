// Public face of lib/config: the deployment config schema (zod) and its loader (file + env).
// Not model loading or serving: lib/serve/runtime.ts turns a config into loaded tiers.
export {
  type ConfigFile,
  configSchema,
  type DeployConfig,
  deploySchema,
  type ProjectorConfig,
  projectorSchema,
  type RouteRule,
  routeRuleSchema,
  samplingSchema,
  type StoreConfig,
  storeSchema,
  type TierConfig,
  tierSchema,
} from "./schema.ts";
export {
  BUNDLED_CONFIG_PATH,
  ConfigError,
  type ConfigSecrets,
  type KvrelayConfig,
  loadConfig,
  parseConfig,
} from "./load.ts";
