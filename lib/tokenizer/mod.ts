// Public face of lib/tokenizer: the Tokenizer class, its errors and the fingerprint helpers.
// Nothing here touches models or native code.

export { type ChatMessage, type ChatToolCall, Tokenizer, TokenizerError } from "./tokenizer.ts";
export { canonicalJson, fingerprintSubject, tokenizerFingerprint } from "./fingerprint.ts";
