// Exact fast decoding for byte-level BPE tokenizers (tokenizer.json decoder "ByteLevel", as GPT-2
// and Qwen): each id's bytes are worked out once, and a run of ASCII bytes becomes text without a
// TextDecoder call. The text equals what @huggingface/tokenizers' decode() returns (its ByteLevel
// decode_chain, mirrored here: added tokens verbatim, every run of other tokens decoded from its
// bytes as UTF-8); used only when that decoder is all decode() does. Not an encoder.
//
// Why: streaming decodes each generated token (plus its predecessor) once; the library's path
// (join the pieces, split them into characters, a keyed lookup per character, a TextDecoder call)
// cost ~1.5 µs per call — ~50 µs of JavaScript per step of 32 batched requests.

/** The parts of an @huggingface/tokenizers Tokenizer (0.2.x) this decoder reads. */
interface HfInternals {
  tokenizer?: { decoder?: { type?: unknown } | null };
  model?: { vocab?: unknown; unk_token?: unknown; end_of_word_suffix?: unknown };
  decoder?: { byte_decoder?: unknown; added_tokens?: unknown; end_of_word_suffix?: unknown } | null;
  clean_up_tokenization_spaces?: unknown;
}

/** One id: its bytes (null for an added token, whose text is `text`), and whether all are ASCII. */
interface Entry {
  bytes: Uint8Array | null;
  text: string;
  ascii: boolean;
}

/** Longest run turned into text by String.fromCharCode (its argument count is bounded). */
const MAX_ASCII_RUN = 4096;

/** Exact byte-level decoding of id lists (see the file comment). */
export class ByteLevelDecoder {
  readonly #pieces: readonly unknown[];
  readonly #unk: unknown;
  readonly #byteOf: Readonly<Record<string, number>>;
  readonly #added: ReadonlySet<string>;
  readonly #entries: (Entry | undefined)[];
  readonly #text = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
  #buf = new Uint8Array(256);

  private constructor(
    pieces: readonly unknown[],
    unk: unknown,
    byteOf: Record<string, number>,
    added: Set<string>,
  ) {
    this.#pieces = pieces;
    this.#unk = unk;
    this.#byteOf = byteOf;
    this.#added = added;
    this.#entries = new Array(pieces.length);
  }

  /**
   * The fast decoder of a tokenizer, when its decode() is exactly the ByteLevel decoder: the
   * tokenizer.json decoder type "ByteLevel", no clean-up of tokenization spaces, no end-of-word
   * suffix, and the library's internals where 0.2.x keeps them.
   * @param hf an @huggingface/tokenizers Tokenizer
   * @returns the decoder, or null when decode() does more (the caller keeps the library's path)
   */
  static from(hf: unknown): ByteLevelDecoder | null {
    const h = hf as HfInternals;
    if (h?.tokenizer?.decoder?.type !== "ByteLevel") return null;
    if (h.clean_up_tokenization_spaces !== false) return null;
    const d = h.decoder, m = h.model;
    if (!d || !m || d.end_of_word_suffix || m.end_of_word_suffix) return null;
    if (!Array.isArray(m.vocab) || !Array.isArray(d.added_tokens)) return null;
    if (d.byte_decoder === null || typeof d.byte_decoder !== "object") return null;
    const added = new Set<string>();
    for (const t of d.added_tokens as { content?: unknown }[]) {
      if (typeof t?.content !== "string") return null;
      added.add(t.content);
    }
    return new ByteLevelDecoder(
      m.vocab,
      m.unk_token,
      d.byte_decoder as Record<string, number>,
      added,
    );
  }

  #entry(id: number): Entry | null {
    let e = this.#entries[id];
    if (e !== undefined) return e;
    // As the library: the id's piece, else the unknown token; an added token's text verbatim.
    const piece = this.#pieces[id] ?? this.#unk;
    if (typeof piece === "string" && this.#added.has(piece)) {
      e = { bytes: null, text: piece, ascii: false };
    } else {
      // A piece holding a surrogate could pair with a neighbour's when the library joins the
      // pieces before splitting them into characters: such ids take the library's path.
      const s = typeof piece === "string" ? piece : "";
      if (/[\uD800-\uDFFF]/.test(s)) return null;
      // The library's conversion: a character outside the byte map gives undefined, which a
      // Uint8Array stores as 0.
      const bytes = new Uint8Array([...s].map((c) => this.#byteOf[c]));
      e = { bytes, text: "", ascii: bytes.every((b) => b < 0x80) };
    }
    this.#entries[id] = e;
    return e;
  }

  /**
   * Decodes ids (each in [0, vocabulary), checked by the caller) as the library would.
   * @param ids token ids, at least one
   * @returns the text, or null when an id needs the library's path
   */
  decode(ids: readonly number[]): string | null {
    let out = "";
    let n = 0;
    let ascii = true;
    for (let i = 0; i < ids.length; i++) {
      const e = this.#entry(ids[i]);
      if (e === null) return null;
      if (e.bytes === null) {
        if (n > 0) out += this.#run(n, ascii);
        n = 0;
        ascii = true;
        out += e.text;
        continue;
      }
      if (n + e.bytes.length > this.#buf.length) {
        const grown = new Uint8Array(2 * (n + e.bytes.length));
        grown.set(this.#buf.subarray(0, n));
        this.#buf = grown;
      }
      this.#buf.set(e.bytes, n);
      n += e.bytes.length;
      ascii &&= e.ascii;
    }
    return n > 0 ? out + this.#run(n, ascii) : out;
  }

  /** The text of the first n buffered bytes: UTF-8 (ASCII maps byte to character). */
  #run(n: number, ascii: boolean): string {
    const bytes = this.#buf.subarray(0, n);
    if (ascii && n <= MAX_ASCII_RUN) {
      return String.fromCharCode.apply(null, bytes as unknown as number[]);
    }
    return this.#text.decode(bytes);
  }
}
