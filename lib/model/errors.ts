// ModelFormatError: the one error type for a bad or unsupported Hugging Face checkpoint
// (config.json, generation_config.json, safetensors headers, shard index, tensor names/shapes).
// It is not used for native failures (those are EngineError in lib/native).

/** A checkpoint file is malformed, inconsistent or uses an unsupported feature. */
export class ModelFormatError extends Error {
  /** The file the problem was found in, when there is one. */
  readonly path?: string;

  /**
   * @param message what is wrong, quoting the offending values
   * @param path the file the problem is in (prefixed to the message when given)
   */
  constructor(message: string, path?: string) {
    super(path === undefined ? message : `${path}: ${message}`);
    this.name = "ModelFormatError";
    this.path = path;
  }
}

/** JSON.stringify for messages, bounded so hostile values cannot flood a log line. */
export function quote(value: unknown, max = 120): string {
  let s: string;
  try {
    s = JSON.stringify(value) ?? String(value);
  } catch {
    s = String(value);
  }
  return s.length > max ? `${s.slice(0, max)}…` : s;
}
