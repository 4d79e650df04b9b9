// Structured output with XGrammar (npm @mlc-ai/web-xgrammar, its WebAssembly build): compiles a
// response_format ({type: "json_object"} or a JSON schema) or the grammar of tool calls against a
// tokenizer's vocabulary, and per request a matcher that gives each step's allowed-token mask
// (the TokenMask a NativeSampler applies natively, lib/native/sampler.ts setMask) and takes each
// sampled token. Each new grammar is first built in the probe worker (probe.ts), so a schema that
// aborts the WebAssembly build never reaches the server's instance; a failure of that instance
// anyway retires it and the next request loads a fresh one. The package is imported lazily, on
// the first structured request. Compiled grammars are cached per (tokenizer fingerprint,
// vocabulary size, stop ids) and canonical schema. Not the HTTP parsing nor the generation loop.

import { canonicalJson, type Tokenizer } from "../tokenizer/mod.ts";
import type { TokenMask } from "../engine/sampling.ts";
import { checkSchema, GrammarInputError } from "./schema_check.ts";
import {
  captureFailure,
  loadXGrammar,
  type XgCompiled,
  type XgCompiler,
  type XgMatcher,
  type XgModule,
  XGrammarFailure,
} from "./load.ts";
import { probeGrammar, warmProbe } from "./probe.ts";
import { fixJsonStrings } from "./ebnf_fix.ts";
import type { ToolCallMode, ToolCallSyntax } from "./tool_tag.ts";

export { GrammarInputError };
export type { ToolCallMode, ToolCallSyntax };

/** What a request asks the output to be. */
export type ResponseFormat =
  | { type: "json_object" }
  | { type: "json_schema"; schema: unknown }
  | {
    type: "tool_calls";
    /** the tools the output may call (≥ 1) */
    tools: ToolSpec[];
    /** auto: text or calls; required: calls only */
    mode: ToolCallMode;
    /** several calls allowed (else at most one) */
    parallel: boolean;
    syntax: ToolCallSyntax;
  };

/** A function the model may call: its name and its parameters' JSON schema. */
export interface ToolSpec {
  name: string;
  /** JSON schema of the arguments object (checked like response_format's) */
  parameters: unknown;
  /** the request field holding `parameters`, for error paths */
  param: string;
}

/** The grammar engine failed while serving (an abort of its WebAssembly module). The request
 *  fails; the instance is replaced, so later requests are served. */
export class GrammarUnavailableError extends Error {
  /** @param message the engine's message */
  constructor(message: string) {
    super(message);
    this.name = "GrammarUnavailableError";
  }
}

/** The server's XGrammar instance: its number (0, then one more per replacement) and its load. */
let instance = 0;
let loading: Promise<XgModule> | null = null;
const engines = new Map<string, Promise<GrammarEngine>>();

function xgrammar(): Promise<XgModule> {
  if (!loading) {
    const p = loadXGrammar(instance);
    p.catch(() => {
      if (loading === p) loading = null;
    });
    loading = p;
  }
  return loading;
}

/** Drops the server's instance after a failure (an abort can leave it inconsistent): the next
 *  request loads a fresh one and builds its engines again. Calls in flight on the old instance
 *  finish or fail on their own. */
function retire(): void {
  instance++;
  loading = null;
  engines.clear();
}

/**
 * Runs one call on the server's instance; a failure retires the instance.
 * @throws {XGrammarFailure} the engine's message
 */
async function guarded<T>(f: () => Promise<T> | T): Promise<T> {
  try {
    return await captureFailure(f);
  } catch (e) {
    retire();
    throw e;
  }
}

/** The engine failed outside compiling a grammar. */
function unavailable(what: string, e: unknown): GrammarUnavailableError {
  const detail = e instanceof XGrammarFailure ? e.detail : String((e as Error)?.message ?? e);
  return new GrammarUnavailableError(
    `the grammar engine failed in ${what}: ${detail} (it is reloaded for the next request)`,
  );
}

/** Most compiled grammars kept per engine (least recently used dropped first). */
const MAX_COMPILED = 128;
/** compileJSONSchema's "no indent": this build maps -1 to none and an absent value to 2 spaces, so
 *  leaving it out would force a newline and indentation between members. */
const NO_INDENT = -1;

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
      warmProbe(); // its start overlaps loading the vocabulary here
      const p = (async () => {
        const xg = await xgrammar();
        const { pieces, type } = tokenizer.grammarVocab();
        try {
          const compiler = await guarded(async () => {
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
        } catch (err) {
          throw unavailable("loading the vocabulary", err);
        }
      })();
      p.catch(() => {
        if (engines.get(key) === p) engines.delete(key);
      });
      engines.set(key, p);
      e = p;
    }
    return e;
  }

  /**
   * Compiles a response format (cached by its canonical JSON). A new one is checked
   * (schema_check.ts), then built in the probe worker, then compiled here.
   *
   * @param format json_object, json_schema with the parsed schema (strict: no other fields), or
   *   tool_calls: text and/or calls of the tools, each call's arguments following its schema
   * @param param the request field holding the schema (json_schema), for error paths
   * @param opts.probe false skips the probe worker for a json_schema (tests of the server
   *   instance's recovery); tool calls are always built there (their schemas convert there)
   * @returns the compiled grammar
   * @throws {GrammarInputError} for a schema the engine cannot compile, naming its field
   */
  async compile(
    format: ResponseFormat,
    param = "response_format.json_schema.schema",
    opts: { probe?: boolean } = {},
  ): Promise<CompiledFormat> {
    let key: string;
    if (format.type === "json_object") {
      key = "json_object";
    } else if (format.type === "tool_calls") {
      if (format.tools.length === 0) throw new GrammarInputError("no tool to call", "tools");
      for (const t of format.tools) checkSchema(t.parameters, t.param);
      const { mode, parallel, syntax } = format;
      const tools = format.tools.map((t) => [t.name, t.parameters]);
      key = `tool_calls:${canonicalJson([mode, parallel, syntax, tools])}`;
    } else {
      checkSchema(format.schema, param);
      key = `json_schema:${canonicalJson(format.schema)}`;
    }
    let p = this.#compiled.get(key);
    if (p) {
      this.#compiled.delete(key); // re-inserted last: most recently used
    } else {
      p = this.#build(format, param, opts.probe ?? true);
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

  /** Probes, then compiles, a format not in the cache. */
  async #build(format: ResponseFormat, param: string, probe: boolean): Promise<XgCompiled> {
    if (format.type === "json_object") {
      // Any JSON object (OpenAI's json_object is an object; XGrammar's builtin JSON grammar
      // takes any JSON value): non-strict, so any properties.
      return await this.#compileHere(
        () =>
          this.#compiler.compileJSONSchema(
            '{"type":"object"}',
            false,
            NO_INDENT,
            [",", ":"],
            false,
          ),
        param,
      );
    }
    if (format.type === "json_schema") {
      const schema = JSON.stringify(format.schema);
      let ebnf: string;
      if (probe) {
        const answer = await probeGrammar({ kind: "json_schema", schema });
        if (!answer.ok) throw refused(param, answer.detail);
        ebnf = answer.ebnf!;
      } else {
        // Strict: no properties beyond the schema's, compact separators (no whitespace runs).
        ebnf = fixJsonStrings(
          await this.#compileHere(
            () => this.#xg.Testings._jsonSchemaToEBNF(schema, false, NO_INDENT, [",", ":"], true),
            param,
          ),
        );
      }
      return await this.#compileHere(() => this.#compiler.compileGrammar(ebnf), param);
    }
    const answer = await probeGrammar({
      kind: "tool_calls",
      tools: format.tools.map((t) => ({ name: t.name, parameters: JSON.stringify(t.parameters) })),
      mode: format.mode,
      parallel: format.parallel,
      syntax: format.syntax,
    });
    const where = answer.ok || answer.tool === undefined
      ? "tools"
      : format.tools[answer.tool].param;
    if (!answer.ok) throw refused(where, answer.detail);
    const tag = answer.structuralTag!;
    return await this.#compileHere(() => this.#compiler.compileStructuralTag(tag), where);
  }

  /** Compiles on the server's instance; a failure there (which the probe did not see) retires
   *  the instance and refuses the format. */
  async #compileHere<T>(f: () => Promise<T>, param: string): Promise<T> {
    try {
      return await guarded(f);
    } catch (e) {
      if (e instanceof XGrammarFailure) throw refused(param, e.detail);
      throw e;
    }
  }
}

/** The 400 for a grammar the engine failed on. */
function refused(param: string, detail: string): GrammarInputError {
  return new GrammarInputError(
    `${param}: the grammar engine cannot compile this schema: ${detail}`,
    param,
  );
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
    try {
      const m = await guarded(() => this.#xg.GrammarMatcher.createGrammarMatcher(this.#compiled));
      return new GrammarMatcher(m, this.#vocabSize);
    } catch (e) {
      throw unavailable("creating a matcher", e);
    }
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
    let bits: Int32Array;
    try {
      bits = await guarded(() => this.#m.getNextTokenBitmask());
    } catch (e) {
      throw unavailable("computing a token mask", e);
    }
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
