// The face of lib/store: snapshot stores (memory, filesystem, redis) behind one interface, and
// the prefix cache built on them. Import from here, not from the individual files. The snapshot
// format itself is lib/snapshot.
export * from "./store.ts";
export * from "./memory_store.ts";
export * from "./fs_store.ts";
// The redis store is imported on first use (createRedisStore): its client library costs about
// 0.2–0.3 s of module loading, which processes without a redis store should not pay at start.
export type { RedisStore, RedisStoreOptions } from "./redis_store.ts";
export * from "./prefix_cache.ts";

/**
 * Creates a RedisStore, importing it (and the redis client) on first use.
 * @param opts the store's options (see RedisStoreOptions)
 * @returns the store (not yet connected; it connects on first use)
 */
export async function createRedisStore(
  opts: import("./redis_store.ts").RedisStoreOptions,
): Promise<import("./redis_store.ts").RedisStore> {
  const { RedisStore } = await import("./redis_store.ts");
  return new RedisStore(opts);
}
