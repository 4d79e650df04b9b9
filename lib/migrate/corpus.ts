// Calibration text → token ids: the files are read in order and only as much text as the
// requested token count needs is tokenized (train.txt is 17 MB; a fit uses ~100k tokens).
// Not a data loader for training; no shuffling.

/** Anything that encodes text without special tokens (lib/tokenizer Tokenizer). */
export interface TextEncoderLike {
  encode(text: string, opts?: { addSpecialTokens?: boolean }): number[];
}

/**
 * Token ids of the concatenated files, at least `tokens` of them when the files hold that many.
 * Reads growing prefixes (8 chars per wanted token, doubling) so the whole corpus is tokenized
 * only when it is needed.
 * @param files text files, concatenated with "\n"
 * @param tokens tokens wanted (>= 1)
 * @param tokenizer encoder
 * @returns ids (possibly more than `tokens`; fewer when the files are short)
 * @throws RangeError for tokens < 1; Deno.errors.NotFound for a missing file
 */
export async function readCorpusTokens(
  files: string[],
  tokens: number,
  tokenizer: TextEncoderLike,
): Promise<number[]> {
  if (!Number.isInteger(tokens) || tokens < 1) {
    throw new RangeError(`tokens must be an integer >= 1, got ${tokens}`);
  }
  const texts = await Promise.all(files.map((f) => Deno.readTextFile(f)));
  const text = texts.join("\n");
  let chars = tokens * 8;
  while (true) {
    const slice = text.slice(0, chars);
    // cut at the last newline so the slice ends on a whole line (stable tokenization)
    const cut = chars >= text.length ? slice : slice.slice(0, Math.max(slice.lastIndexOf("\n"), 1));
    const ids = tokenizer.encode(cut, { addSpecialTokens: false });
    if (ids.length >= tokens || chars >= text.length) return ids;
    chars *= 2;
  }
}
