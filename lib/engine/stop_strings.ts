// Stop-string matching over a stream of text deltas: emits only text that can no longer be part
// of a stop string, and reports where the first stop string begins. Pure string logic; it does
// not know about tokens or models.

/** What one push of text produced. */
export interface StopStep {
  /** Text now safe to emit (may be ""). */
  emit: string;
  /** True when a stop string completed: nothing after `emit` belongs to the output. */
  stopped: boolean;
  /** The stop string that matched, when stopped. */
  matched?: string;
}

/**
 * Holds back the longest tail of the text that is a proper prefix of some stop string, and cuts
 * the output at the start of the first stop string to complete (the earliest end; on a tie the
 * earliest start). Once stopped it ignores input.
 */
export class StopStringMatcher {
  readonly #stops: string[];
  #pending = "";
  #stopped = false;

  /**
   * @param stops stop strings; empty strings are not allowed
   * @throws {TypeError} when a stop is not a non-empty string
   */
  constructor(stops: readonly string[]) {
    stops.forEach((s, i) => {
      if (typeof s !== "string" || s.length === 0) {
        throw new TypeError(
          `stop string #${i} must be a non-empty string, got ${JSON.stringify(s)}`,
        );
      }
    });
    this.#stops = [...stops];
  }

  /** Whether a stop string has matched. */
  get stopped(): boolean {
    return this.#stopped;
  }

  /** Text received but not yet emitted (a possible start of a stop string). */
  get pending(): string {
    return this.#pending;
  }

  /**
   * Adds the next piece of generated text.
   *
   * @param delta new text
   * @returns what may be emitted now, and whether a stop string completed
   */
  push(delta: string): StopStep {
    if (this.#stopped) return { emit: "", stopped: true };
    const text = this.#pending + delta;
    // The stop that completes first (earliest end) wins, as when reading one character at a
    // time; on equal ends the longer one (earlier start). Chunking does not change the result.
    let cut = -1;
    let end = Infinity;
    let matched: string | undefined;
    for (const stop of this.#stops) {
      const at = text.indexOf(stop);
      if (at < 0) continue;
      const e = at + stop.length;
      if (e < end || (e === end && at < cut)) {
        cut = at;
        end = e;
        matched = stop;
      }
    }
    if (cut >= 0) {
      this.#stopped = true;
      this.#pending = "";
      return { emit: text.slice(0, cut), stopped: true, matched };
    }
    const hold = this.#heldTail(text);
    this.#pending = text.slice(text.length - hold);
    return { emit: text.slice(0, text.length - hold), stopped: false };
  }

  /**
   * Ends the stream without a match: releases held-back text.
   *
   * @returns the held-back text ("" after a stop)
   */
  flush(): string {
    const rest = this.#pending;
    this.#pending = "";
    return this.#stopped ? "" : rest;
  }

  // Length of the longest suffix of text that is a proper prefix of some stop string.
  #heldTail(text: string): number {
    let best = 0;
    for (const stop of this.#stops) {
      const maxLen = Math.min(stop.length - 1, text.length);
      for (let len = maxLen; len > best; len--) {
        if (text.endsWith(stop.slice(0, len))) {
          best = len;
          break;
        }
      }
    }
    return best;
  }
}
