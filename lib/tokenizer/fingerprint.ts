// Tokenizer fingerprint: hex SHA-256 over a canonical JSON of the parts of tokenizer.json that
// decide which id a piece of text gets and what an id means. Not a hash of the file bytes:
// whitespace, key order and the merges spelling ("a b" vs ["a","b"]) do not change it.

/**
 * Serializes a JSON value canonically: object keys sorted by UTF-16 code units, no whitespace,
 * `undefined` members dropped (as JSON.stringify does).
 *
 * @param value a JSON-compatible value (objects, arrays, strings, finite numbers, booleans, null)
 * @returns the canonical JSON text
 * @throws {TypeError} when the value holds a non-finite number, a bigint, a function or a symbol
 */
export function canonicalJson(value: unknown): string {
  // Fast path for the big arrays (a 151k-token vocab as [id, token] pairs, as many merges): an
  // array of primitives or of arrays of primitives has no keys to sort, so JSON.stringify
  // writes exactly what the walk below would, natively and far faster (Qwen3: ~1.3 s → ms).
  const primitive = (x: unknown) =>
    x === null || x === undefined || typeof x === "string" || typeof x === "boolean" ||
    (typeof x === "number" && Number.isFinite(x));
  const flat = (x: unknown) => primitive(x) || (Array.isArray(x) && x.every(primitive));
  const parts: string[] = [];
  const walk = (v: unknown): void => {
    if (v === null) {
      parts.push("null");
    } else if (typeof v === "string" || typeof v === "boolean") {
      parts.push(JSON.stringify(v));
    } else if (typeof v === "number") {
      if (!Number.isFinite(v)) throw new TypeError(`canonicalJson: non-finite number ${v}`);
      parts.push(JSON.stringify(v));
    } else if (Array.isArray(v) && v.every(flat)) {
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

/**
 * Builds the object the tokenizer fingerprint hashes, from a parsed tokenizer.json:
 * - `model`: every field of `model` (type, unk_token, byte_fallback, ...), with `vocab` as the
 *   list of tokens ordered by id when it is a token→id map (Unigram's [token, score] list stays as
 *   is) and `merges` as [left, right] pairs whichever of the two HF spellings the file uses;
 *   `dropout` is dropped (it is a training-time knob, null at inference);
 * - `added_tokens`: sorted by id, each with id, content, special, lstrip, rstrip, normalized,
 *   single_word;
 * - `normalizer`, `pre_tokenizer`.
 * Left out on purpose: `decoder`, `post_processor`, `truncation`, `padding` and the chat template.
 * They do not change what an id means or how text encodes without special tokens, which is what
 * a KV snapshot's token ids depend on.
 *
 * @param tokenizerJson the parsed tokenizer.json
 * @returns a JSON-compatible object
 * @throws {TypeError} when `model` is missing or a merge is neither "a b" nor ["a", "b"]
 */
export function fingerprintSubject(tokenizerJson: Record<string, unknown>): unknown {
  const model = tokenizerJson.model;
  if (model === null || typeof model !== "object" || Array.isArray(model)) {
    throw new TypeError('tokenizer.json has no "model" object');
  }
  const { dropout: _dropout, vocab, merges, ...rest } = model as Record<string, unknown>;
  let canonicalVocab: unknown = vocab;
  if (vocab !== null && typeof vocab === "object" && !Array.isArray(vocab)) {
    const entries = Object.entries(vocab as Record<string, number>);
    entries.sort((a, b) => a[1] - b[1] || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    canonicalVocab = entries.map(([token, id]) => [id, token]);
  }
  let canonicalMerges: unknown = merges;
  if (Array.isArray(merges)) {
    canonicalMerges = merges.map((m, i) => {
      if (typeof m === "string") {
        const pair = m.split(" ");
        if (pair.length !== 2) {
          throw new TypeError(
            `tokenizer.json merge #${i} ${JSON.stringify(m)} is not "left right"`,
          );
        }
        return pair;
      }
      if (Array.isArray(m) && m.length === 2 && m.every((x) => typeof x === "string")) return m;
      throw new TypeError(
        `tokenizer.json merge #${i} ${JSON.stringify(m)} is not a pair of strings`,
      );
    });
  }
  const added = Array.isArray(tokenizerJson.added_tokens) ? tokenizerJson.added_tokens : [];
  const canonicalAdded = (added as Record<string, unknown>[])
    .map((t) => ({
      id: t.id,
      content: t.content,
      special: t.special ?? false,
      lstrip: t.lstrip ?? false,
      rstrip: t.rstrip ?? false,
      normalized: t.normalized ?? false,
      single_word: t.single_word ?? false,
    }))
    .sort((a, b) => Number(a.id) - Number(b.id));
  return {
    model: { ...rest, vocab: canonicalVocab, merges: canonicalMerges },
    added_tokens: canonicalAdded,
    normalizer: tokenizerJson.normalizer ?? null,
    pre_tokenizer: tokenizerJson.pre_tokenizer ?? null,
  };
}

/**
 * Computes the tokenizer fingerprint (see {@link fingerprintSubject} for what it covers).
 *
 * @param tokenizerJson the parsed tokenizer.json
 * @returns lowercase hex SHA-256 (64 characters) of the canonical JSON, UTF-8 encoded
 * @throws {TypeError} as {@link fingerprintSubject} and {@link canonicalJson}
 */
export async function tokenizerFingerprint(
  tokenizerJson: Record<string, unknown>,
): Promise<string> {
  const bytes = new TextEncoder().encode(canonicalJson(fingerprintSubject(tokenizerJson)));
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}
