// Face of lib/util: tiny helpers with no domain of their own (hex, SHA-256, canonical JSON).
// Anything with a concept belongs in its own lib/ folder instead.
export { fromHex, hex, sha256 } from "./bytes.ts";
