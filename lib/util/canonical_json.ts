// Canonical JSON: object keys sorted by UTF-16 code units, no whitespace, `undefined` members
// dropped (undefined array items become null, as JSON.stringify does), non-finite numbers
// refused. The one serialization every fingerprint hashes (models, tokenizers).

/**
 * Serializes a JSON value canonically.
 * @param value a JSON-compatible value (objects, arrays, strings, finite numbers, booleans, null)
 * @returns the canonical JSON text
 * @throws {TypeError} when the value holds a non-finite number, a bigint, a function or a symbol
 */
export function canonicalJson(value: unknown): string {
  const parts: string[] = [];
  const walk = (v: unknown): void => {
    if (v === null) {
      parts.push("null");
    } else if (typeof v === "string" || typeof v === "boolean") {
      parts.push(JSON.stringify(v));
    } else if (typeof v === "number") {
      if (!Number.isFinite(v)) throw new TypeError(`canonicalJson: non-finite number ${v}`);
      parts.push(JSON.stringify(v));
    } else if (Array.isArray(v)) {
      parts.push("[");
      v.forEach((item, i) => {
        if (i > 0) parts.push(",");
        walk(item === undefined ? null : item);
      });
      parts.push("]");
    } else if (typeof v === "object") {
      const obj = v as Record<string, unknown>;
      const keys = Object.keys(obj).filter((k) => obj[k] !== undefined).sort();
      parts.push("{");
      keys.forEach((k, i) => {
        if (i > 0) parts.push(",");
        parts.push(JSON.stringify(k), ":");
        walk(obj[k]);
      });
      parts.push("}");
    } else {
      throw new TypeError(`canonicalJson: unsupported value of type ${typeof v}`);
    }
  };
  walk(value);
  return parts.join("");
}
