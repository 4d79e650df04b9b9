// Typed errors of cross-model migration: a refusal (the caller falls back to full prefill) with a
// machine-readable reason, and a malformed projector artifact. No recovery logic lives here.

/** Why a migration was refused. */
export type MigrationRefusalReason =
  | "tokenizer_mismatch"
  | "source_mismatch"
  | "target_mismatch"
  | "geometry_mismatch"
  | "no_projector"
  | "no_quality"
  | "quality_below_threshold"
  | "prompt_too_short"
  | "projection_out_of_range";

/** Migration cannot or must not run for this pair/request; callers fall back to full prefill. */
export class MigrationRefusedError extends Error {
  /** machine-readable cause */
  readonly reason: MigrationRefusalReason;

  /**
   * @param reason machine-readable cause
   * @param message human-readable detail quoting the values involved
   */
  constructor(reason: MigrationRefusalReason, message: string) {
    super(`migration refused (${reason}): ${message}`);
    this.name = "MigrationRefusedError";
    this.reason = reason;
  }
}

/** A projector directory (projector.json / weights) is missing, malformed or inconsistent. */
export class ProjectorFormatError extends Error {
  /** the offending file, when known */
  readonly path?: string;

  /**
   * @param message what is wrong, quoting the value
   * @param path the offending file
   */
  constructor(message: string, path?: string) {
    super(path ? `${path}: ${message}` : message);
    this.name = "ProjectorFormatError";
    this.path = path;
  }
}

/** The `onnx` projector kind needs the optional onnxruntime-node part, which this installation
 *  leaves out (the serving deno.json, an image built without KVRELAY_ONNX=1) or cannot load. */
export class OnnxRuntimeMissingError extends ProjectorFormatError {
  /**
   * @param cause why loading failed (the runtime's first line)
   * @param path the projector's .onnx file, when known
   */
  constructor(cause: string, path?: string) {
    super(
      "the onnx projector kind needs the optional onnxruntime-node part, which is not installed " +
        "here (the serving deno.json leaves it out: run with --config deno.dev.json, which imports " +
        "it; images leave it out unless built with --build-arg KVRELAY_ONNX=1; " +
        `see docs/migration.md): ${cause}`,
      path,
    );
    this.name = "OnnxRuntimeMissingError";
  }
}
