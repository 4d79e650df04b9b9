// Bytes of request bodies this process holds at once: every snapshot upload reserves its declared
// size (from its header, before any chunk arrives) and returns it when the import is done, so
// hostile or concurrent uploads cannot grow memory past one configured bound.
import { BusyError } from "./errors.ts";

/** A per-process budget of in-flight upload bytes. */
export class UploadBudget {
  #used = 0;

  /**
   * @param limit most bytes held at once
   * @param onChange called with the bytes held after every change (for a gauge)
   */
  constructor(
    readonly limit: number,
    private readonly onChange: (used: number) => void = () => {},
  ) {}

  /** Bytes held now. */
  get used(): number {
    return this.#used;
  }

  /**
   * Reserves `n` bytes.
   * @param n bytes (the upload's declared size)
   * @returns the release function (idempotent)
   * @throws {BusyError} when the reservation would exceed the limit
   */
  reserve(n: number): () => void {
    if (this.#used + n > this.limit) {
      throw new BusyError(
        `${this.#used} bytes of uploads are in flight; ${n} more would exceed this process's bound of ${this.limit}`,
        1,
      );
    }
    this.#used += n;
    this.onChange(this.#used);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.#used -= n;
      this.onChange(this.#used);
    };
  }
}
