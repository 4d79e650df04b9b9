// Domain errors of the serving core: bad input naming its field, an unknown tier or snapshot, a
// refusal because the server cannot serve now (not ready, shutting down, deadline, client gone),
// a snapshot no tier serves, a payload over a bound. No HTTP here: functions/ maps each class to
// a status and a JSON body in one place (functions/shared/errors.ts).

/** What kind of input problem an {@link InputError} is: a bad value, a prompt over the context,
 *  or a body that did not arrive within its deadline (a stalled or too slow upload). */
export type InputErrorCode = "invalid_request" | "context_length_exceeded" | "body_timeout";

/** The request's input is wrong; `param` names the field at fault. */
export class InputError extends Error {
  /**
   * @param message human-readable, quoting the offending value
   * @param param the request field at fault (dotted path), when there is one
   * @param code the kind of problem (default "invalid_request")
   */
  constructor(
    message: string,
    readonly param?: string,
    readonly code: InputErrorCode = "invalid_request",
  ) {
    super(message);
    this.name = "InputError";
  }
}

/** A named thing (tier, stored snapshot, peer) does not exist. */
export class NotFoundError extends Error {
  /**
   * @param message names what was looked up and what exists
   * @param param the request field that named it
   */
  constructor(message: string, readonly param?: string) {
    super(message);
    this.name = "NotFoundError";
  }
}

/** Why the server could not serve a request now. */
export type UnavailableReason =
  | "not_ready"
  | "shutting_down"
  | "client_gone"
  | "timeout"
  | "device_failed";

/** The request could not be served now: models loading, shutdown, its deadline, its client, or a
 * tier's device failed (a CUDA fault: the process must restart). */
export class UnavailableError extends Error {
  /**
   * @param reason why
   * @param message human-readable detail (quotes the deadline for "timeout")
   */
  constructor(readonly reason: UnavailableReason, message: string) {
    super(message);
    this.name = "UnavailableError";
  }
}

/** A payload exceeds a configured bound. */
export class TooLargeError extends Error {
  /**
   * @param message quotes the bound
   * @param param the field carrying the payload (e.g. "body")
   */
  constructor(message: string, readonly param?: string) {
    super(message);
    this.name = "TooLargeError";
  }
}

/** A snapshot was made by a model no tier here serves. */
export class SnapshotMismatchError extends Error {
  /**
   * @param message quotes the snapshot's model fingerprint
   * @param param the field carrying the snapshot, when known
   */
  constructor(message: string, readonly param?: string) {
    super(message);
    this.name = "SnapshotMismatchError";
  }
}

/** The process is at a bound that frees itself (e.g. bytes of uploads in flight): retry later. */
export class BusyError extends Error {
  /**
   * @param message names the bound and its value
   * @param retryAfterS suggested wait, whole seconds ≥ 1
   */
  constructor(message: string, readonly retryAfterS: number) {
    super(message);
    this.name = "BusyError";
  }
}

/** A step's logits row held no finite value (every logit NaN or −Inf), so no token can be drawn:
 * the cache (an imported or migrated snapshot) or the model's weights hold values that overflow.
 * The request fails with this cause rather than as an internal error. */
export class NonFiniteLogitsError extends Error {
  /**
   * @param message names the tier and the engine's message
   */
  constructor(message: string) {
    super(message);
    this.name = "NonFiniteLogitsError";
  }
}
