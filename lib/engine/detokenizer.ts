// Incremental detokenization: turns generated token ids into text deltas one id at a time,
// without splitting UTF-8 characters and with the spacing the prompt context implies. Uses the
// prefix/read-offset scheme of vLLM and transformers' TextStreamer; no sampling, no stop logic.

/** The part of a tokenizer the detokenizer needs. */
export interface Decoder {
  decode(ids: ArrayLike<number>, opts?: { skipSpecialTokens?: boolean }): string;
}

/** How many prompt tokens give the first generated tokens their context (leading spaces). */
const CONTEXT_TOKENS = 5;

/** Text of one id per decoder and skipSpecialTokens setting. decode() is a pure function of its
 *  ids, and in the steady state each push decodes the previous id alone (the prefix text): memoized,
 *  that is one tokenizer call per token instead of two (~1 µs each; 32 per step of 32 requests). At
 *  most one entry per vocabulary id. */
const singleIds = new WeakMap<Decoder, Map<number, string>[]>();

function decodeOne(decoder: Decoder, id: number, skipSpecialTokens: boolean): string {
  let maps = singleIds.get(decoder);
  if (!maps) singleIds.set(decoder, maps = [new Map(), new Map()]);
  const map = maps[skipSpecialTokens ? 1 : 0];
  let text = map.get(id);
  if (text === undefined) {
    text = decoder.decode([id], { skipSpecialTokens });
    map.set(id, text);
  }
  return text;
}

/**
 * Emits, for each pushed id, the text it completes. The text of ids[prefix..] minus the text of
 * ids[prefix..read] is the new text; it is withheld while it ends in U+FFFD (an incomplete UTF-8
 * sequence that later bytes may complete). `flush()` releases whatever is withheld at the end.
 */
export class IncrementalDetokenizer {
  readonly #decoder: Decoder;
  readonly #skipSpecialTokens: boolean;
  readonly #ids: number[];
  #prefixOffset: number;
  #readOffset: number;

  /**
   * @param decoder the tokenizer
   * @param contextIds the ids before the generated ones (the prompt); only the last few are used
   * @param opts.skipSpecialTokens leave special tokens out of the text; default true
   */
  constructor(
    decoder: Decoder,
    contextIds: ArrayLike<number> = [],
    opts: { skipSpecialTokens?: boolean } = {},
  ) {
    this.#decoder = decoder;
    this.#skipSpecialTokens = opts.skipSpecialTokens ?? true;
    const start = Math.max(0, contextIds.length - CONTEXT_TOKENS);
    this.#ids = Array.from({ length: contextIds.length - start }, (_, i) => contextIds[start + i]);
    this.#prefixOffset = 0;
    this.#readOffset = this.#ids.length;
  }

  /**
   * Adds one generated id.
   *
   * @param id the token id
   * @returns the text this id completes ("" while a character is incomplete)
   * @throws {RangeError} from the decoder for ids outside the vocabulary
   */
  push(id: number): string {
    this.#ids.push(id);
    const opts = { skipSpecialTokens: this.#skipSpecialTokens };
    const prefixText = this.#readOffset - this.#prefixOffset === 1
      ? decodeOne(this.#decoder, this.#ids[this.#prefixOffset], this.#skipSpecialTokens)
      : this.#decoder.decode(this.#ids.slice(this.#prefixOffset, this.#readOffset), opts);
    const newText = this.#decoder.decode(this.#ids.slice(this.#prefixOffset), opts);
    if (newText.length > prefixText.length && !newText.endsWith("\uFFFD")) {
      this.#prefixOffset = this.#readOffset;
      this.#readOffset = this.#ids.length;
      return newText.slice(prefixText.length);
    }
    return "";
  }

  /**
   * Releases text still withheld (an incomplete character at the very end decodes as U+FFFD).
   *
   * @returns the remaining text
   */
  flush(): string {
    if (this.#readOffset === this.#ids.length) return "";
    const opts = { skipSpecialTokens: this.#skipSpecialTokens };
    const prefixText = this.#decoder.decode(
      this.#ids.slice(this.#prefixOffset, this.#readOffset),
      opts,
    );
    const newText = this.#decoder.decode(this.#ids.slice(this.#prefixOffset), opts);
    this.#prefixOffset = this.#readOffset;
    this.#readOffset = this.#ids.length;
    return newText.slice(prefixText.length);
  }
}
