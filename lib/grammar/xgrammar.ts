// Structured output with XGrammar (npm @mlc-ai/web-xgrammar, its WebAssembly build): compiles a
// response_format ({type: "json_object"} or a JSON schema) against a tokenizer's vocabulary, and
// per request a matcher that gives each step's allowed-token mask (the TokenMask a NativeSampler
// applies natively, lib/native/sampler.ts setMask) and takes each sampled token. The package is
// imported lazily, on the first structured request, so serving without one never loads it.
// Compiled grammars are cached per (tokenizer fingerprint, vocabulary size, stop ids) and
// canonical schema. Not the HTTP parsing of response_format nor the generation loop.

import { canonicalJson, type Tokenizer } from "../tokenizer/mod.ts";
import type { TokenMask } from "../engine/sampling.ts";
import { checkSchema, GrammarInputError } from "./schema_check.ts";

export { GrammarInputError };

/** What a request asks the output to be. */
export type ResponseFormat =
  | { type: "json_object" }
  | { type: "json_schema"; schema: unknown }
  | { type: "tool_call"; tools: ToolSpec[]; open: string; close: string };

/** A function the model may call: its name and its parameters' JSON schema. */
export interface ToolSpec {
  name: string;
  /** JSON schema of the arguments object (checked like response_format's, without $ref) */
  parameters: unknown;
}

/** The grammar engine failed in a way that leaves it unusable (an abort of its WebAssembly
 *  module); structured output is unavailable until the process restarts. */
export class GrammarUnavailableError extends Error {
  /** @param message the engine's message */
  constructor(message: string) {
    super(message);
    this.name = "GrammarUnavailableError";
  }
}

// The parts of the package used here (its own .d.ts types the rest).
interface XgMatcher {
  acceptToken(id: number): boolean;
  getNextTokenBitmask(): Promise<Int32Array>;
  isTerminated(): boolean;
  dispose(): void;
}
interface XgCompiled {
  dispose(): void;
}
interface XgCompiler {
  compileJSONSchema(
    schema: string,
    anyWhitespace?: boolean,
    indent?: number,
    separators?: [string, string],
    strictMode?: boolean,
  ): Promise<XgCompiled>;
  compileGrammar(ebnf: string, rootRule?: string): Promise<XgCompiled>;
}
interface XgModule {
  Testings: {
    _jsonSchemaToEBNF(
      schema: string,
      anyWhitespace?: boolean,
      indent?: number,
      separators?: [string, string],
      strictMode?: boolean,
    ): Promise<string>;
  };
  TokenizerInfo: {
    createTokenizerInfo(
      vocab: string[],
      type: string,
      prependSpace: boolean,
      vocabSize: number,
      stopTokenIds: number[],
    ): Promise<unknown>;
  };
  GrammarCompiler: { createGrammarCompiler(info: unknown, cache?: boolean): Promise<XgCompiler> };
  GrammarMatcher: { createGrammarMatcher(compiled: XgCompiled): Promise<XgMatcher> };
  Grammar: { builtinJSONGrammar(): Promise<{ dispose(): void }> };
}

let loading: Promise<XgModule> | null = null;
/** set once the module aborted: its instance is broken from then on */
let broken: string | null = null;
/** the module's stderr lines while a call runs (its error messages), else null */
let captured: string[] | null = null;

/**
 * Loads the package once. Its bundle is UMD inside a `type: module` package: evaluated as ESM it
 * attaches itself to globalThis.xgrammar, and its Emscripten loader needs `require`,
 * `__filename` and `__dirname` while it instantiates. Those globals exist only for that moment,
 * so no other module sees a CommonJS environment. The loader binds console.error when it starts:
 * a forwarding function is installed then, so the module's messages (its only account of a
 * failure) can be captured per call.
 */
function loadXGrammar(): Promise<XgModule> {
  loading ??= (async () => {
    const g = globalThis as Record<string, unknown>;
    const { createRequire } = await import("node:module");
    const saved = { require: g.require, __filename: g.__filename, __dirname: g.__dirname };
    const consoleError = console.error;
    g.require = createRequire(import.meta.url);
    g.__filename = new URL(import.meta.url).pathname;
    g.__dirname = new URL(".", import.meta.url).pathname;
    console.error = (...args: unknown[]) => {
      if (captured) captured.push(args.map(String).join(" "));
      else consoleError(...args);
    };
    try {
      await import("@mlc-ai/web-xgrammar");
      const xg = g.xgrammar as XgModule;
      (await xg.Grammar.builtinJSONGrammar()).dispose(); // instantiates the WebAssembly module
      return xg;
    } finally {
      console.error = consoleError;
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete g[k];
        else g[k] = v;
      }
      delete g.xgrammar;
    }
  })();
  return loading;
}

/** Runs one engine call, turning an abort into GrammarUnavailableError with its message. */
async function guarded<T>(what: string, f: () => Promise<T> | T): Promise<T> {
  if (broken) throw new GrammarUnavailableError(broken);
  captured = [];
  try {
    return await f();
  } catch (e) {
    const detail = captured.filter((l) => !l.startsWith("Aborted(")).join("; ");
    broken = `the grammar engine failed in ${what}: ${detail || (e as Error).message}`;
    throw new GrammarUnavailableError(broken);
  } finally {
    captured = null;
  }
}

/**
 * Refuses `$ref` in a tool's parameters: the tools' schemas are nested into one, where a local
 * reference would point at the wrong root.
 * @throws {GrammarInputError} naming the reference
 */
function noRef(v: unknown, path: string): void {
  if (v === null || typeof v !== "object") return;
  for (const [k, w] of Object.entries(v)) {
    if (k === "$ref" && typeof w === "string") {
      throw new GrammarInputError(`$ref is not supported in tool parameters`, `${path}.$ref`);
    }
    noRef(w, `${path}.${k}`);
  }
}

/** Most compiled grammars kept per engine (least recently used dropped first). */
const MAX_COMPILED = 128;
/** compileJSONSchema's "no indent": this build maps -1 to none and an absent value to 2 spaces, so
 *  leaving it out would force a newline and indentation between members. */
const NO_INDENT = -1;

const engines = new Map<string, Promise<GrammarEngine>>();

/** XGrammar's compiler for one tokenizer and logits width, with its compiled-grammar cache. */
export class GrammarEngine {
  /** the logits width the masks cover (the model's vocabulary, padding included) */
  readonly vocabSize: number;
  readonly #compiler: XgCompiler;
  readonly #xg: XgModule;
  readonly #compiled = new Map<string, Promise<XgCompiled>>();

  /** How many compiled grammars the cache holds. */
  get cached(): number {
    return this.#compiled.size;
  }

  private constructor(xg: XgModule, compiler: XgCompiler, vocabSize: number) {
    this.#xg = xg;
    this.#compiler = compiler;
    this.vocabSize = vocabSize;
  }

  /**
   * The engine of a tokenizer (built once per tokenizer fingerprint, width and stop ids).
   *
   * @param tokenizer the model's tokenizer
   * @param vocabSize the model's logits width (>= tokenizer.vocabSize)
   * @param stopTokenIds the ids that end generation (the matcher accepts them at the end)
   * @returns the engine
   */
  static forTokenizer(
    tokenizer: Tokenizer,
    vocabSize: number,
    stopTokenIds: readonly number[],
  ): Promise<GrammarEngine> {
    const key = `${tokenizer.fingerprint}/${vocabSize}/${stopTokenIds.join(",")}`;
    let e = engines.get(key);
    if (!e) {
      e = (async () => {
        const xg = await loadXGrammar();
        const { pieces, type } = tokenizer.grammarVocab();
        const compiler = await guarded("loading the vocabulary", async () => {
          const info = await xg.TokenizerInfo.createTokenizerInfo(
            pieces,
            type,
            false,
            vocabSize,
            [...stopTokenIds],
          );
          return await xg.GrammarCompiler.createGrammarCompiler(info, false);
        });
        return new GrammarEngine(xg, compiler, vocabSize);
      })();
      engines.set(key, e);
      e.catch(() => engines.delete(key));
    }
    return e;
  }

  /**
   * Compiles a response format (cached by its canonical JSON).
   *
   * @param format json_object, json_schema with the parsed schema (strict: no other fields), or
   *   tool_call: one call of one of the tools, between fixed open and close texts
   * @param param the request field holding the schema, for error paths
   * @returns the compiled grammar
   * @throws {GrammarInputError} for a schema the engine cannot compile, naming its path
   */
  async compile(
    format: ResponseFormat,
    param = "response_format.json_schema.schema",
  ): Promise<CompiledFormat> {
    let key: string;
    if (format.type === "json_object") {
      key = "json_object";
    } else if (format.type === "tool_call") {
      // An empty anyOf would abort the WebAssembly module (and break it for the process).
      if (format.tools.length === 0) throw new GrammarInputError("no tool to call", param);
      format.tools.forEach((t, i) => {
        const at = `${param}.${i}.function.parameters`;
        checkSchema(t.parameters, at);
        noRef(t.parameters, at);
      });
      key = `tool_call:${canonicalJson([format.open, format.close, format.tools])}`;
    } else {
      checkSchema(format.schema, param);
      key = `json_schema:${canonicalJson(format.schema)}`;
    }
    let p = this.#compiled.get(key);
    if (p) {
      this.#compiled.delete(key); // re-inserted last: most recently used
    } else {
      p = guarded(
        "compiling the grammar",
        () =>
          format.type === "tool_call"
            ? this.#toolCall(format.tools, format.open, format.close)
            : format.type === "json_object"
            // Any JSON object (OpenAI's json_object is an object; XGrammar's builtin JSON
            // grammar takes any JSON value): non-strict, so any properties.
            ? this.#compiler.compileJSONSchema(
              '{"type":"object"}',
              false,
              NO_INDENT,
              [",", ":"],
              false,
            )
            // Strict: no properties beyond the schema's, compact separators (no whitespace runs).
            : this.#compiler.compileJSONSchema(
              JSON.stringify(format.schema),
              false,
              NO_INDENT,
              [",", ":"],
              true,
            ),
      );
      p.catch(() => this.#compiled.delete(key));
      while (this.#compiled.size >= MAX_COMPILED) {
        const [oldest, q] = this.#compiled.entries().next().value!;
        this.#compiled.delete(oldest);
        q.then((c) => c.dispose(), () => {});
      }
    }
    this.#compiled.set(key, p);
    return new CompiledFormat(this.#xg, await p, this.vocabSize);
  }

  /**
   * One call of one of the tools: `<open>{"name": "<name>", "arguments": <args>}<close>` with
   * the arguments following that tool's schema. Built as one JSON schema (an anyOf over the
   * tools, `name` a const) converted to EBNF, wrapped in a rule that adds the fixed open and
   * close text. Separators ", " and ": " and no indent: the spacing chat templates show models.
   */
  async #toolCall(tools: ToolSpec[], open: string, close: string): Promise<XgCompiled> {
    const schema = {
      anyOf: tools.map((t) => ({
        type: "object",
        properties: { name: { const: t.name }, arguments: t.parameters },
        required: ["name", "arguments"],
      })),
    };
    const ebnf = await this.#xg.Testings._jsonSchemaToEBNF(
      JSON.stringify(schema),
      false,
      -1,
      [", ", ": "],
      true,
    );
    const root = `tool_call_root ::= ${JSON.stringify(open)} root ${JSON.stringify(close)}`;
    return await this.#compiler.compileGrammar(`${ebnf}\n${root}\n`, "tool_call_root");
  }
}

/** A compiled response format: makes a matcher per request. */
export class CompiledFormat {
  readonly #xg: XgModule;
  readonly #compiled: XgCompiled;
  readonly #vocabSize: number;

  /** @internal */
  constructor(xg: XgModule, compiled: XgCompiled, vocabSize: number) {
    this.#xg = xg;
    this.#compiled = compiled;
    this.#vocabSize = vocabSize;
  }

  /** A fresh matcher at the start of the output. Dispose it when the request ends. */
  async matcher(): Promise<GrammarMatcher> {
    const m = await guarded(
      "creating a matcher",
      () => this.#xg.GrammarMatcher.createGrammarMatcher(this.#compiled),
    );
    return new GrammarMatcher(m, this.#vocabSize);
  }
}

/** One request's grammar state: the next step's mask, and the tokens sampled under it. */
export class GrammarMatcher {
  readonly #m: XgMatcher;
  readonly #vocabSize: number;
  #disposed = false;

  /** @internal */
  constructor(m: XgMatcher, vocabSize: number) {
    this.#m = m;
    this.#vocabSize = vocabSize;
  }

  /**
   * The tokens the grammar allows next (the stop tokens once the output is complete).
   * @returns a mask over the engine's vocabulary size
   */
  async nextMask(): Promise<TokenMask> {
    this.#live();
    const bits = await guarded("computing a token mask", () => this.#m.getNextTokenBitmask());
    const words = new Uint32Array(bits.buffer, bits.byteOffset, bits.length);
    const tail = this.#vocabSize % 32;
    if (tail !== 0) words[words.length - 1] &= (1 << tail) - 1;
    return { words, nTokens: this.#vocabSize };
  }

  /**
   * Advances the grammar by a sampled token.
   * @param token an id the last mask allowed
   * @returns false when the grammar rejects it (the state is unchanged then)
   */
  accept(token: number): boolean {
    this.#live();
    return this.#m.acceptToken(token);
  }

  /** Whether a stop token has been accepted: the output is complete. */
  get terminated(): boolean {
    this.#live();
    return this.#m.isTerminated();
  }

  /** Frees the matcher (idempotent). */
  dispose(): void {
    if (!this.#disposed) this.#m.dispose();
    this.#disposed = true;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  #live(): void {
    if (this.#disposed) throw new Error("GrammarMatcher: disposed");
  }
}
