// Bytes of request bodies this process holds at once (JSON bodies and snapshot uploads, snapshot
// headers included): each request's hold is charged as its bytes arrive, from the first one, and
// returned when the request is done with them. A client is charged what it actually sent, never
// what it declared, so stalled clients that declare huge snapshots cannot starve honest uploads,
// and a stalled header is bounded like any other byte.
import { BusyError } from "./errors.ts";

/** The bytes one request body holds in a {@link BodyBudget}. */
export interface BodyHold {
  /** Bytes charged to this hold now. */
  readonly held: number;
  /**
   * Charges `n` more bytes (they have arrived and are kept).
   * @throws {BusyError} when the process's budget would be exceeded (nothing is charged then)
   */
  add(n: number): void;
  /** Returns every byte of this hold to the budget (idempotent; later `add`s are refused). */
  release(): void;
}

/** A per-process budget of request-body bytes held in memory. */
export class BodyBudget {
  #used = 0;

  /**
   * @param limit most bytes held at once
   * @param name the setting that configures `limit` (quoted in the 429's message)
   * @param onChange called with the bytes held after every change (for a gauge)
   */
  constructor(
    readonly limit: number,
    readonly name: string,
    private readonly onChange: (used: number) => void = () => {},
  ) {}

  /** Bytes held now, all requests together. */
  get used(): number {
    return this.#used;
  }

  /**
   * Opens a hold for one request body, holding nothing yet.
   * @returns the hold; release it when the request is done with the bytes, however it ends
   */
  hold(): BodyHold {
    let held = 0;
    let released = false;
    const add = (n: number) => {
      if (released) throw new BusyError("request body already released", 1);
      if (n <= 0) return;
      if (this.#used + n > this.limit) {
        throw new BusyError(
          `request bodies in flight hold ${this.#used} bytes; ${n} more would exceed this ` +
            `process's budget of ${this.limit} bytes (${this.name})`,
          1,
        );
      }
      held += n;
      this.#used += n;
      this.onChange(this.#used);
    };
    const release = () => {
      if (released) return;
      released = true;
      this.#used -= held;
      held = 0;
      this.onChange(this.#used);
    };
    return {
      get held() {
        return held;
      },
      add,
      release,
    };
  }
}
