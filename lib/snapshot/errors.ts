// SnapshotError: the one typed error every snapshot reader/writer failure becomes, with a `kind`
// the CLI prints and the HTTP layer maps to a status. Not for programmer errors in arguments
// (those stay TypeError/RangeError) nor for native engine failures (EngineError).

/** What failed about a snapshot; stable strings for CLI messages and HTTP mapping. */
export type SnapshotErrorKind =
  | "checksum" // a CRC32C did not match: bytes changed in transit or on disk
  | "fingerprint" // model/tokenizer fingerprint or geometry differs from the importing model
  | "version" // unknown major format version
  | "bounds" // a length, count or offset outside its limit or past the bytes available
  | "signature" // HMAC missing, unknown key id, or tag mismatch
  | "format" // structurally invalid (bad magic, inconsistent fields, trailing bytes)
  | "too_large"; // exceeds the configured maximum snapshot size

/** A snapshot could not be read or written; `kind` says which check failed. */
export class SnapshotError extends Error {
  /** Which check failed. */
  readonly kind: SnapshotErrorKind;

  /**
   * @param kind which check failed
   * @param message one line, quoting the offending values
   */
  constructor(kind: SnapshotErrorKind, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "SnapshotError";
    this.kind = kind;
  }
}
