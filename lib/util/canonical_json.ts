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
    } else if (Array.isArray(v) && flat(v)) {
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

// A JSON primitive JSON.stringify writes canonically (non-finite numbers are not: walk throws).
function primitive(x: unknown): boolean {
  return x === null || x === undefined || typeof x === "string" || typeof x === "boolean" ||
    (typeof x === "number" && Number.isFinite(x));
}

// An array of primitives or of arrays of primitives has no keys to sort: one JSON.stringify call
// writes exactly the canonical text (undefined items as null, like walk). A 151k-token
// tokenizer's vocab and merges are such arrays: one native call instead of ~10^6 string parts.
function flat(v: unknown[]): boolean {
  for (const item of v) {
    if (Array.isArray(item)) {
      for (const x of item) if (!primitive(x)) return false;
    } else if (!primitive(item)) {
      return false;
    }
  }
  return true;
}
