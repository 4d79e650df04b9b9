// Corrects two rules XGrammar's JSON-schema converter (this build) emits that let a JSON string
// hold characters JSON forbids raw: a length-bounded string's character class `[^"\\\r\n]`
// admits the other control characters (U+0000–U+001F), and a pattern's `.` becomes
// `[\u0000-\U0010FFFF]`, which admits `"`, `\` and control characters too. Both become the
// class of characters a JSON string may hold unescaped. Applied to the converter's EBNF text
// before it is compiled; not a general EBNF rewriter.

/** A JSON string's unescaped characters, in XGrammar's EBNF. */
const JSON_CHAR = String.raw`[^"\\\0-\x1f]`;
const BOUNDED = String.raw`[^"\\\r\n]`;
const ANY = String.raw`[\u0000-\U0010FFFF]`;

/**
 * Rewrites the converter's string rules so every output is valid JSON.
 * @param ebnf the converter's EBNF
 * @returns the same grammar with those classes narrowed
 */
export function fixJsonStrings(ebnf: string): string {
  return ebnf.replaceAll(BOUNDED, JSON_CHAR).replaceAll(ANY, JSON_CHAR);
}
