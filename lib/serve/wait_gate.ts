// The admission gate of a tier that batches: how many requests may wait for the scheduler at once.
// Running requests are bounded by the KV pool's blocks (the scheduler's plan and reservations),
// not here; what this bounds is the line in front of them. A request takes a ticket when it is
// admitted and the ticket counts as waiting until the request's first row is planned, its block
// reservation is granted, or it ends: counting the sequences waiting inside the scheduler instead
// would miss requests still on their way there (hashing prompt blocks, reading the prefix store,
// receiving and checking a snapshot), and a burst of them would all be let in.
// One more than `depth` waiting is refused at once (QueueFullError: 429 + Retry-After).
import { QueueFullError } from "./queue.ts";

/** One admitted request's place in the line. */
export interface Ticket {
  /** Whether it still counts as waiting. */
  readonly waiting: boolean;
  /** The request got capacity (its first row was planned, its blocks granted): it stops
   *  waiting. Idempotent. */
  start(): void;
  /** The request ended, or gave up, without starting: it stops waiting. Idempotent. */
  release(): void;
}

/** Bounds the requests waiting for a batching tier's scheduler. */
export class WaitGate {
  #waiting = 0;
  /** Seconds a started ticket waited (exponential moving average), for Retry-After. */
  #avgWaitS = 1;

  /**
   * @param tier name quoted in errors
   * @param depth most tickets waiting (≥ 0; one may always wait, so a tier with nothing
   *   waiting never refuses)
   * @param onChange called with the tickets waiting after every change (for the gauge)
   */
  constructor(
    readonly tier: string,
    readonly depth: number,
    private readonly onChange: (waiting: number) => void = () => {},
  ) {
    if (!Number.isInteger(depth) || depth < 0) {
      throw new RangeError(`queue depth must be an integer ≥ 0, got ${depth}`);
    }
  }

  /** Tickets waiting now. */
  get waiting(): number {
    return this.#waiting;
  }

  /**
   * Admits a request as waiting.
   * @returns its ticket
   * @throws {QueueFullError} when `depth` tickets (at least one) already wait
   */
  admit(): Ticket {
    if (this.#waiting >= Math.max(1, this.depth)) {
      throw new QueueFullError(this.tier, Math.max(1, Math.ceil(this.#avgWaitS)));
    }
    this.#waiting++;
    this.onChange(this.#waiting);
    const t0 = performance.now();
    let waiting = true;
    const leave = (started: boolean) => {
      if (!waiting) return;
      waiting = false;
      this.#waiting--;
      if (started) {
        this.#avgWaitS = 0.8 * this.#avgWaitS + 0.2 * (performance.now() - t0) / 1000;
      }
      this.onChange(this.#waiting);
    };
    return {
      get waiting() {
        return waiting;
      },
      start: () => leave(true),
      release: () => leave(false),
    };
  }
}
