// Loads XGrammar's WebAssembly build (npm @mlc-ai/web-xgrammar) into the calling isolate: the
// server's thread, or the probe worker's (probe_worker.ts). Each call of loadXGrammar with a new
// instance number evaluates the bundle again and so instantiates a separate WebAssembly module:
// an instance an abort may have left inconsistent is dropped and replaced, not reused. Also the
// capture of the module's stderr, its only account of a failure. Not the compiling or matching.

/** The parts of the package used here (its own .d.ts types the rest). */
export interface XgMatcher {
  acceptToken(id: number): boolean;
  getNextTokenBitmask(): Promise<Int32Array>;
  isTerminated(): boolean;
  dispose(): void;
}
/** A compiled grammar of the package. */
export interface XgCompiled {
  dispose(): void;
}
/** The package's compiler for one vocabulary. */
export interface XgCompiler {
  compileJSONSchema(
    schema: string,
    anyWhitespace?: boolean,
    indent?: number,
    separators?: [string, string],
    strictMode?: boolean,
  ): Promise<XgCompiled>;
  compileStructuralTag(structuralTag: string): Promise<XgCompiled>;
  compileGrammar(ebnf: string, rootRule?: string): Promise<XgCompiled>;
}
/** The package's exports used here. */
export interface XgModule {
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
  Grammar: {
    builtinJSONGrammar(): Promise<{ dispose(): void }>;
    fromJSONSchema(
      schema: string,
      anyWhitespace?: boolean,
      indent?: number,
      separators?: [string, string],
      strictMode?: boolean,
    ): Promise<{ dispose(): void }>;
    fromStructuralTag(structuralTag: string): Promise<{ dispose(): void }>;
    fromEBNF(ebnf: string, rootRule?: string): Promise<{ dispose(): void }>;
  };
}

/** An engine call failed (for this build: its module aborted); `detail` is what it printed. */
export class XGrammarFailure extends Error {
  /** the module's own message (its stderr lines, "Aborted()" left out), or the thrown one */
  readonly detail: string;
  /** @param detail the module's message */
  constructor(detail: string) {
    super(detail);
    this.name = "XGrammarFailure";
    this.detail = detail;
  }
}

/** the module's stderr lines while a call runs, else null */
let captured: string[] | null = null;

/**
 * Instantiates the package. Its bundle is UMD inside a `type: module` package: evaluated as ESM
 * it attaches itself to globalThis.xgrammar, and its Emscripten loader needs `require`,
 * `__filename` and `__dirname` while it instantiates. Those globals exist only for that moment, so
 * no other module sees a CommonJS environment. The loader binds console.error when it starts: a
 * forwarding function is installed then, so the module's messages can be captured per call.
 * Instance 0 is the package as imported; instance n > 0 imports the same file under another URL
 * (a query naming n), which evaluates it again with its own WebAssembly memory.
 *
 * @param instance 0 for the first instance of this isolate, then 1, 2, ... for replacements
 * @returns the module's exports
 */
export async function loadXGrammar(instance: number): Promise<XgModule> {
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
    if (instance === 0) await import("@mlc-ai/web-xgrammar");
    else await import(`${import.meta.resolve("@mlc-ai/web-xgrammar")}?instance=${instance}`);
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
}

/**
 * Runs one engine call, capturing what the module prints.
 * @param f the call
 * @returns its result
 * @throws {XGrammarFailure} when it throws, with the module's message
 */
export async function captureFailure<T>(f: () => Promise<T> | T): Promise<T> {
  const lines: string[] = [];
  captured = lines;
  try {
    return await f();
  } catch (e) {
    // Lines read "[FATAL] <source path>:<line>: <message>": the message is what the user needs.
    const detail = lines.filter((l) => !l.startsWith("Aborted("))
      .map((l) => l.replace(/^\[[A-Z]+\] \S+:\d+: /, "")).join("; ");
    throw new XGrammarFailure(detail || (e as Error)?.message || String(e));
  } finally {
    if (captured === lines) captured = null;
  }
}
