// A per-model admission gate: at most `concurrency` holders at once, at most `depth` waiting;
// beyond that `acquire` refuses at once (the HTTP layer answers 429 + Retry-After). Waiters
// leave the line when their signal aborts. FIFO; no priorities, no fairness across users.

/** The queue is full: try again after `retryAfterS` seconds. */
export class QueueFullError extends Error {
  /**
   * @param tier the tier whose queue is full
   * @param retryAfterS suggested wait, whole seconds ≥ 1
   */
  constructor(readonly tier: string, readonly retryAfterS: number) {
    super(`tier "${tier}" is at capacity: too many requests waiting; retry after ${retryAfterS} s`);
    this.name = "QueueFullError";
  }
}

interface Waiter {
  resolve: (release: () => void) => void;
  reject: (e: unknown) => void;
  onAbort?: () => void;
  signal?: AbortSignal;
}

/** Bounded FIFO of generation slots for one model. */
export class ModelQueue {
  #running = 0;
  readonly #waiting: Waiter[] = [];
  /** Average seconds a slot is held, for Retry-After (exponential moving average). */
  #avgHoldS = 1;

  /**
   * @param tier name quoted in errors
   * @param concurrency slots (≥ 1)
   * @param depth most waiters (≥ 0)
   * @param onChange called with (running, waiting) after every change (for gauges)
   */
  constructor(
    readonly tier: string,
    readonly concurrency: number,
    readonly depth: number,
    private readonly onChange: (running: number, waiting: number) => void = () => {},
  ) {
    if (!Number.isInteger(concurrency) || concurrency < 1) {
      throw new RangeError(`concurrency must be an integer ≥ 1, got ${concurrency}`);
    }
    if (!Number.isInteger(depth) || depth < 0) {
      throw new RangeError(`queue depth must be an integer ≥ 0, got ${depth}`);
    }
  }

  /** Holders now. */
  get running(): number {
    return this.#running;
  }
  /** Waiters now. */
  get waiting(): number {
    return this.#waiting.length;
  }

  /**
   * Waits for a slot.
   * @param signal aborting leaves the line (the promise rejects with the signal's reason)
   * @returns a release function (idempotent) to call when done
   * @throws {QueueFullError} at once when `depth` requests already wait
   */
  acquire(signal?: AbortSignal): Promise<() => void> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.#running < this.concurrency && this.#waiting.length === 0) {
      this.#running++;
      this.onChange(this.#running, this.#waiting.length);
      return Promise.resolve(this.#releaser());
    }
    if (this.#waiting.length >= this.depth) {
      const ahead = this.#waiting.length + this.#running;
      const retry = Math.max(1, Math.ceil((this.#avgHoldS * ahead) / this.concurrency));
      return Promise.reject(new QueueFullError(this.tier, retry));
    }
    return new Promise((resolve, reject) => {
      const w: Waiter = { resolve, reject, signal };
      if (signal) {
        w.onAbort = () => {
          const i = this.#waiting.indexOf(w);
          if (i >= 0) {
            this.#waiting.splice(i, 1);
            this.onChange(this.#running, this.#waiting.length);
          }
          reject(signal.reason);
        };
        signal.addEventListener("abort", w.onAbort, { once: true });
      }
      this.#waiting.push(w);
      this.onChange(this.#running, this.#waiting.length);
    });
  }

  #releaser(): () => void {
    const start = performance.now();
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const held = (performance.now() - start) / 1000;
      this.#avgHoldS = 0.8 * this.#avgHoldS + 0.2 * held;
      const next = this.#waiting.shift();
      if (next) {
        if (next.onAbort) next.signal?.removeEventListener("abort", next.onAbort);
        this.onChange(this.#running, this.#waiting.length);
        next.resolve(this.#releaser());
      } else {
        this.#running--;
        this.onChange(this.#running, this.#waiting.length);
      }
    };
  }
}
