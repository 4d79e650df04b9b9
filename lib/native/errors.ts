// EngineError: a failed libkvrelay call (negative kvr_status) as a JS error with the status
// code, its name and the library's message. Argument errors found in TS before any FFI call are
// TypeError/RangeError instead, never EngineError.

import { STATUS_NAMES } from "./abi.ts";

/** A native call returned a non-OK kvr_status. */
export class EngineError extends Error {
  /** the kvr_status value (negative) */
  readonly code: number;
  /** the status name, e.g. "CAPACITY", "OUT_OF_RANGE" */
  readonly codeName: string;

  /**
   * @param code the kvr_status returned
   * @param message the native message (kvr_last_error / kvr_seq_last_error)
   * @param call the C function that failed, prefixed to the message
   */
  constructor(code: number, message: string, call?: string) {
    const codeName = STATUS_NAMES[code] ?? "UNKNOWN";
    const prefix = call ? `${call} failed (${codeName}, ${code})` : `${codeName} (${code})`;
    super(message ? `${prefix}: ${message}` : prefix);
    this.name = "EngineError";
    this.code = code;
    this.codeName = codeName;
  }
}

/** A sampled logits row held no finite logit (all NaN or −Inf): the step ran, its draw did not.
 *  Distinct from other failures so the serving core can report the cause (a cache or weights whose
 *  values overflow), not an internal error. */
export class NoFiniteLogitError extends EngineError {
  /**
   * @param message the sampler's message (kvr_sampler_last_error)
   * @param call the C function whose draw failed
   */
  constructor(message: string, call: string) {
    super(-1, message, call);
    this.name = "NoFiniteLogitError";
  }
}

/** A masked sampler's row (kvr_sampler_set_mask) held no allowed token with a finite logit: the
 *  step ran, its draw did not. A structured-output request whose grammar allows only tokens the
 *  model rules out (or only ids past the sampled width) ends here, not in a crash. */
export class NoAllowedTokenError extends EngineError {
  /**
   * @param message the sampler's message (kvr_sampler_last_error)
   * @param call the C function whose draw failed
   */
  constructor(message: string, call: string) {
    super(-1, message, call);
    this.name = "NoAllowedTokenError";
  }
}
