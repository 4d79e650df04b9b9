// Face of lib/util: tiny helpers with no domain of their own (hex, SHA-256, canonical JSON, a test
// PRNG). Anything with a concept belongs in its own lib/ folder instead.
export { concatBytes, fromHex, hex, sha256 } from "./bytes.ts";
export { canonicalJson } from "./canonical_json.ts";
export { mulberry32 } from "./mulberry32.ts";
