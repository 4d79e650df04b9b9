// Tokenizer: a Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) run by
// @huggingface/tokenizers, with chat templates rendered by @huggingface/jinja and a fingerprint.
// Text in, ids out and back; it knows nothing about models, sequences or sampling.

import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";
import { ByteLevelDecoder } from "./byte_level.ts";
import { tokenizerFingerprint } from "./fingerprint.ts";

/** A tokenizer directory or its files are missing, unreadable or not a tokenizer. */
export class TokenizerError extends Error {
  /** The file the problem is in, when there is one. */
  readonly path?: string;
  /**
   * @param message what is wrong, quoting the offending value
   * @param path the file concerned
   */
  constructor(message: string, path?: string) {
    super(message);
    this.name = "TokenizerError";
    this.path = path;
  }
}

/** One tool call of an assistant message, as HF chat templates expect it. */
export interface ChatToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/** One chat message as chat templates expect it (tool calls and results in HF's shape). */
export interface ChatMessage {
  role: string;
  content: string;
  tool_calls?: ChatToolCall[];
  tool_call_id?: string;
}

async function readJson(path: string): Promise<Record<string, unknown>> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    throw new TokenizerError(`cannot read ${path}: ${(e as Error).message}`, path);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new TokenizerError(`${path} is not valid JSON: ${(e as Error).message}`, path);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new TokenizerError(`${path} does not hold a JSON object`, path);
  }
  return value as Record<string, unknown>;
}

/**
 * A loaded tokenizer. `encode` adds no special tokens unless asked (the demo tokenizer has no
 * BOS either way); special-token text in the input ("<|im_end|>") still maps to its single id,
 * as in transformers with `split_special_tokens=False`.
 */
export class Tokenizer {
  /** Number of ids the tokenizer knows: model vocabulary plus added tokens (max id + 1). */
  readonly vocabSize: number;
  /** Hex SHA-256 of the canonical vocab, merges, added tokens, normalizer and pre-tokenizer. */
  readonly fingerprint: string;
  /** The chat template from tokenizer_config.json, or null when it has none. */
  readonly chatTemplate: string | null;
  /** Upper bound on the UTF-16 length of the text one token stands for (the longest vocabulary
   *  entry's spelling, ≥ its decoded length for byte-level BPE and metaspace vocabularies). */
  readonly maxTokenChars: number;
  readonly #hf: HfTokenizer;
  readonly #config: Record<string, unknown>;
  readonly #json: Record<string, unknown> | null;
  #worker: Worker | null = null;
  #nextId = 0;
  readonly #pending = new Map<
    number,
    { resolve: (ids: number[]) => void; reject: (e: Error) => void }
  >();
  readonly #specialIds: Set<number>;
  /** exact fast decoding when the decoder is byte-level (byte_level.ts), else null */
  readonly #byteLevel: ByteLevelDecoder | null;
  #template: Template | null = null;

  private constructor(
    hf: HfTokenizer,
    config: Record<string, unknown>,
    fingerprint: string,
    json: Record<string, unknown> | null,
  ) {
    this.#hf = hf;
    this.#config = config;
    this.#json = json;
    this.fingerprint = fingerprint;
    let maxId = -1;
    let maxChars = 1;
    for (const [piece, id] of hf.get_vocab(true)) {
      maxId = Math.max(maxId, id);
      maxChars = Math.max(maxChars, piece.length);
    }
    this.vocabSize = maxId + 1;
    this.maxTokenChars = maxChars;
    this.#specialIds = new Set(
      [...hf.get_added_tokens_decoder().entries()].filter(([, t]) => t.special).map(([id]) => id),
    );
    this.#byteLevel = ByteLevelDecoder.from(hf);
    const template = config.chat_template;
    // Some configs hold a list of named templates: [{name: "default", template: "..."}, ...].
    if (typeof template === "string") {
      this.chatTemplate = template;
    } else if (Array.isArray(template)) {
      const named = template.find((t) => t?.name === "default") ?? template[0];
      this.chatTemplate = typeof named?.template === "string" ? named.template : null;
    } else {
      this.chatTemplate = null;
    }
  }

  /**
   * Loads `tokenizer.json` and `tokenizer_config.json` (optional: defaults to `{}`) from a
   * directory.
   *
   * @param dir directory holding the tokenizer files
   * @returns the tokenizer
   * @throws {TokenizerError} when tokenizer.json is missing, not JSON, or not a tokenizer
   */
  static async load(dir: string): Promise<Tokenizer> {
    const tokenizerPath = `${dir}/tokenizer.json`;
    const configPath = `${dir}/tokenizer_config.json`;
    const json = await readJson(tokenizerPath);
    let config: Record<string, unknown> = {};
    try {
      await Deno.stat(configPath);
      config = await readJson(configPath);
    } catch (e) {
      if (e instanceof TokenizerError) throw e;
      if (!(e instanceof Deno.errors.NotFound)) {
        throw new TokenizerError(`cannot read ${configPath}: ${(e as Error).message}`, configPath);
      }
    }
    return await Tokenizer.fromJson(json, config, tokenizerPath);
  }

  /**
   * Builds a tokenizer from already parsed files.
   *
   * @param tokenizerJson parsed tokenizer.json
   * @param tokenizerConfig parsed tokenizer_config.json (`{}` when there is none)
   * @param source name used in error messages
   * @returns the tokenizer
   * @throws {TokenizerError} when the JSON is not a tokenizer this library can run
   */
  static async fromJson(
    tokenizerJson: Record<string, unknown>,
    tokenizerConfig: Record<string, unknown> = {},
    source = "tokenizer.json",
  ): Promise<Tokenizer> {
    let hf: HfTokenizer;
    let fingerprint: string;
    try {
      // Decoding keeps text as the model wrote it unless the config asks for the legacy cleanup
      // (" ." → "."), which would break round trips.
      const config = {
        ...tokenizerConfig,
        clean_up_tokenization_spaces: tokenizerConfig.clean_up_tokenization_spaces ?? false,
      };
      hf = new HfTokenizer(tokenizerJson, config);
      fingerprint = await tokenizerFingerprint(tokenizerJson);
    } catch (e) {
      throw new TokenizerError(
        `${source} is not a usable tokenizer: ${(e as Error).message}`,
        source,
      );
    }
    return new Tokenizer(hf, tokenizerConfig, fingerprint, tokenizerJson);
  }

  /**
   * Encodes text to token ids.
   *
   * @param text any string (may be empty: gives [])
   * @param opts.addSpecialTokens run the post-processor's template (BOS/EOS where the tokenizer
   *   defines them); default false
   * @returns token ids, each in [0, vocabSize)
   * @throws {TypeError} when text is not a string
   * @throws {TokenizerError} when a piece of text has no id (a tokenizer without byte fallback)
   */
  encode(text: string, opts: { addSpecialTokens?: boolean } = {}): number[] {
    if (typeof text !== "string") {
      throw new TypeError(`encode: text must be a string, got ${typeof text}`);
    }
    if (text.length === 0 && !opts.addSpecialTokens) return [];
    const { ids, tokens } = this.#hf.encode(text, {
      add_special_tokens: opts.addSpecialTokens ?? false,
    });
    for (let i = 0; i < ids.length; i++) {
      if (ids[i] === undefined || ids[i] === null) {
        throw new TokenizerError(
          `encode: piece ${
            JSON.stringify(tokens[i])
          } has no token id and the tokenizer has no unk token`,
        );
      }
    }
    return ids;
  }

  /**
   * Encodes text like {@link encode}, on a worker thread when the text is long (≥ `inlineChars`
   * UTF-16 units), so a megabyte prompt does not block the caller's event loop. Same ids as
   * `encode`: the worker runs this class on the same tokenizer files.
   * @param text any string
   * @param opts addSpecialTokens as for encode; inlineChars: below it, encode inline (default 4096)
   * @returns token ids
   * @throws {TokenizerError} as encode (the worker's message)
   */
  encodeAsync(
    text: string,
    opts: { addSpecialTokens?: boolean; inlineChars?: number } = {},
  ): Promise<number[]> {
    if (text.length < (opts.inlineChars ?? 4096) || this.#json === null) {
      try {
        return Promise.resolve(this.encode(text, opts));
      } catch (e) {
        return Promise.reject(e);
      }
    }
    if (!this.#worker) {
      const w = new Worker(new URL("./worker.ts", import.meta.url), { type: "module" });
      w.onmessage = (e: MessageEvent) => {
        const m = e.data as { id: number; ids?: number[]; error?: string };
        const p = this.#pending.get(m.id);
        if (!p) return;
        this.#pending.delete(m.id);
        if (m.ids) p.resolve(m.ids);
        else p.reject(new TokenizerError(m.error ?? "tokenizer worker failed"));
      };
      w.onerror = (e: ErrorEvent) => {
        e.preventDefault();
        for (const p of this.#pending.values()) {
          p.reject(new TokenizerError(`tokenizer worker failed: ${e.message}`));
        }
        this.#pending.clear();
        this.#worker?.terminate();
        this.#worker = null;
      };
      w.postMessage({ init: { json: this.#json, config: this.#config } });
      this.#worker = w;
    }
    const id = this.#nextId++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      this.#worker!.postMessage({ id, text, addSpecialTokens: opts.addSpecialTokens ?? false });
    });
  }

  /** Stops the worker thread, if one was started (pending encodes fail). Idempotent. */
  close(): void {
    for (const p of this.#pending.values()) p.reject(new TokenizerError("tokenizer closed"));
    this.#pending.clear();
    this.#worker?.terminate();
    this.#worker = null;
  }

  /**
   * Decodes token ids to text. Bytes that do not form complete UTF-8 decode to U+FFFD.
   *
   * @param ids token ids, each an integer in [0, vocabSize)
   * @param opts.skipSpecialTokens drop special tokens (<|endoftext|>, ...); default false
   * @returns the text ("" for no ids)
   * @throws {RangeError} when an id is not an integer in [0, vocabSize)
   */
  decode(ids: ArrayLike<number>, opts: { skipSpecialTokens?: boolean } = {}): string {
    const list: number[] = new Array(ids.length);
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
        throw new RangeError(
          `decode: token id ${id} at index ${i} is not an integer in [0, ${this.vocabSize})`,
        );
      }
      list[i] = id;
    }
    const kept = opts.skipSpecialTokens ? list.filter((id) => !this.#specialIds.has(id)) : list;
    if (kept.length === 0) return "";
    return this.#byteLevel?.decode(kept) ?? this.#hf.decode(kept, { skip_special_tokens: false });
  }

  /**
   * Renders a conversation with the tokenizer's chat template (tokenizer_config.json
   * `chat_template`), passing `bos_token`/`eos_token` from the config as transformers does.
   *
   * @param messages the conversation, oldest first
   * @param opts.addGenerationPrompt append the template's assistant-turn opener; default true
   * @param opts.tools tool definitions (OpenAI's `tools` entries) for templates with a tool section
   * @returns the prompt text (encode it with `encode`, which adds no special tokens)
   * @throws {TokenizerError} when the tokenizer has no chat template or the template fails
   * @throws {TypeError} when a message is not {role: string, content: string}
   */
  applyChatTemplate(
    messages: ChatMessage[],
    opts: { addGenerationPrompt?: boolean; tools?: unknown[] } = {},
  ): string {
    if (!Array.isArray(messages)) {
      throw new TypeError("applyChatTemplate: messages must be an array");
    }
    messages.forEach((m, i) => {
      if (typeof m?.role !== "string" || typeof m?.content !== "string") {
        throw new TypeError(
          `applyChatTemplate: message #${i} ${
            JSON.stringify(m)
          } is not {role: string, content: string}`,
        );
      }
    });
    if (this.chatTemplate === null) {
      throw new TokenizerError("this tokenizer has no chat_template in tokenizer_config.json");
    }
    try {
      this.#template ??= new Template(this.chatTemplate);
      return this.#template.render({
        messages,
        // HF's convention: the tool definitions (OpenAI's `tools` entries) as `tools`, absent
        // when there are none so templates' `{% if tools %}` sections stay out.
        ...(opts.tools && opts.tools.length > 0 ? { tools: opts.tools } : {}),
        add_generation_prompt: opts.addGenerationPrompt ?? true,
        bos_token: tokenText(this.#config.bos_token),
        eos_token: tokenText(this.#config.eos_token),
        pad_token: tokenText(this.#config.pad_token),
        unk_token: tokenText(this.#config.unk_token),
      });
    } catch (e) {
      throw new TokenizerError(`chat template failed: ${(e as Error).message}`);
    }
  }

  /**
   * Looks up the id of one token string (as spelled in the vocabulary, e.g. "Ġthe" for
   * byte-level BPE, or an added token like "<|im_end|>").
   *
   * @param token the token string
   * @returns its id, or undefined when the vocabulary has no such token
   */
  tokenId(token: string): number | undefined {
    return this.#hf.token_to_id(token);
  }

  /**
   * Looks up the token string of an id.
   *
   * @param id a token id
   * @returns the token string, or undefined when the id is out of range
   */
  tokenString(id: number): string | undefined {
    return this.#hf.id_to_token(id);
  }

  /**
   * The vocabulary as a grammar engine reads it (XGrammar's TokenizerInfo): every token string
   * by id (added tokens included; "" for an id the vocabulary skips) and how those strings
   * spell bytes: "byte_level" (GPT-2 byte-to-unicode, as this class decodes them),
   * "byte_fallback" (SentencePiece "▁" and <0xNN> tokens) or "raw".
   *
   * @returns the token strings and the vocabulary type
   */
  grammarVocab(): { pieces: string[]; type: "byte_level" | "byte_fallback" | "raw" } {
    const pieces = new Array<string>(this.vocabSize).fill("");
    for (const [piece, id] of this.#hf.get_vocab(true)) pieces[id] = piece;
    if (this.#byteLevel) return { pieces, type: "byte_level" };
    const model = this.#json?.model as Record<string, unknown> | undefined;
    return { pieces, type: model?.byte_fallback === true ? "byte_fallback" : "raw" };
  }

  /**
   * Whether an id is a special added token (<|endoftext|>, <|im_start|>, ...).
   *
   * @param id a token id
   * @returns true for special tokens
   */
  isSpecial(id: number): boolean {
    return this.#specialIds.has(id);
  }
}

// tokenizer_config.json spells special tokens as a string or as {content: "..."}.
function tokenText(value: unknown): string {
  if (typeof value === "string") return value;
  if (
    value !== null && typeof value === "object" &&
    typeof (value as { content?: unknown }).content === "string"
  ) {
    return (value as { content: string }).content;
  }
  return "";
}
