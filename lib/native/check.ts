// Argument checks run before any FFI call: integers within bounds and typed-array lengths, with
// messages quoting the values. Throws TypeError (wrong kind) or RangeError (out of bounds).

/**
 * Checks that `value` is an integer in [min, max].
 * @param name parameter name for the message
 * @param value the value
 * @param min smallest allowed
 * @param max largest allowed
 * @returns the value
 * @throws TypeError when not an integer number; RangeError when out of bounds
 */
export function checkInt(name: string, value: unknown, min: number, max: number): number {
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw new TypeError(`${name} must be an integer, got ${quoteValue(value)}`);
  }
  if (value < min || value > max) {
    throw new RangeError(`${name} must be in [${min}, ${max}], got ${value}`);
  }
  return value;
}

/** JSON-ish quoting for messages, bounded in length. */
export function quoteValue(value: unknown): string {
  let s: string;
  try {
    s = typeof value === "bigint" ? `${value}n` : JSON.stringify(value) ?? String(value);
  } catch {
    s = String(value);
  }
  return s.length > 80 ? `${s.slice(0, 80)}…` : s;
}

/** Largest u32. */
export const U32_MAX = 0xffffffff;
