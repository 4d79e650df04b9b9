// The face of lib/store: snapshot stores (memory, filesystem, redis) behind one interface, and
// the prefix cache built on them. Import from here, not from the individual files. The snapshot
// format itself is lib/snapshot.
export * from "./store.ts";
export * from "./memory_store.ts";
export * from "./fs_store.ts";
export * from "./redis_store.ts";
export * from "./prefix_cache.ts";
