// Tokenizer fingerprint: hex SHA-256 over a canonical JSON of the parts of tokenizer.json that
// decide which id a piece of text gets and what an id means. Not a hash of the file bytes:
// whitespace, key order and the merges spelling ("a b" vs ["a","b"]) do not change it.
import { canonicalJson, hex, sha256 } from "../util/mod.ts";

export { canonicalJson };

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
  return hex(await sha256(bytes));
}
