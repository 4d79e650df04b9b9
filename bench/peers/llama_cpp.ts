// llama.cpp for the peer benchmark, called through llama.h by Deno FFI: the shared libraries that
// node-llama-cpp ships prebuilt (npm @node-llama-cpp/linux-x64, the binary `npm i node-llama-cpp`
// installs), its best CPU variant loaded by ggml's backend registry, and a persistent ggml thread
// pool attached to each context as llama-server does (node-llama-cpp's JS binding attaches none,
// so each graph spawns and joins threads). Bench-only; nothing in lib/ imports it.
//
// Struct layouts (llama_model_params 80 B, llama_context_params 160 B, llama_batch 56 B,
// ggml_threadpool_params 528 B) are those of the llama.h in node-llama-cpp 3.21.1's llama.cpp
// source bundle, measured with offsetof; load() checks the library's defaults at those offsets.

/** The node-llama-cpp release whose prebuilt llama.cpp this binds (pinned in deno.json). */
export const NODE_LLAMA_CPP_VERSION = "3.21.1";

const MODEL_PARAMS_BYTES = 80;
const CONTEXT_PARAMS_BYTES = 160;
const BATCH_BYTES = 56;
const THREADPOOL_PARAMS_BYTES = 528;
// llama_context_params field offsets (bytes)
const CP = {
  nCtx: 0,
  nBatch: 4,
  nUbatch: 8,
  nSeqMax: 12,
  nThreads: 28,
  nThreadsBatch: 32,
  flashAttnType: 52,
  typeK: 104,
  typeV: 108,
  offloadKqv: 129,
  noPerf: 130,
};
// llama_model_params: n_gpu_layers at 16, vocab_only at 72
const MP = { nGpuLayers: 16, vocabOnly: 72 };
// ggml_threadpool_params: cpumask[512], n_threads at 512, poll at 520
const TP = { nThreads: 512, poll: 520 };

const words = (bytes: number) => ({ struct: Array(bytes / 8).fill("u64") }) as const;
// SysV x86-64 passes and returns structs over 16 bytes in memory whatever their fields, so a
// u64 array of the same size and alignment is ABI-identical to the real struct.
const MODEL_PARAMS = words(MODEL_PARAMS_BYTES) as unknown as Deno.NativeStructType;
const CONTEXT_PARAMS = words(CONTEXT_PARAMS_BYTES) as unknown as Deno.NativeStructType;
const BATCH = words(BATCH_BYTES) as unknown as Deno.NativeStructType;

const LLAMA_SYMBOLS = {
  llama_backend_init: { parameters: [], result: "void" },
  llama_log_set: { parameters: ["function", "pointer"], result: "void" },
  llama_print_system_info: { parameters: [], result: "pointer" },
  llama_model_default_params: { parameters: [], result: MODEL_PARAMS },
  llama_context_default_params: { parameters: [], result: CONTEXT_PARAMS },
  llama_model_load_from_file: { parameters: ["buffer", MODEL_PARAMS], result: "pointer" },
  llama_model_free: { parameters: ["pointer"], result: "void" },
  llama_model_size: { parameters: ["pointer"], result: "u64" },
  llama_model_n_params: { parameters: ["pointer"], result: "u64" },
  llama_model_get_vocab: { parameters: ["pointer"], result: "pointer" },
  llama_vocab_n_tokens: { parameters: ["pointer"], result: "i32" },
  llama_tokenize: {
    parameters: ["pointer", "buffer", "i32", "buffer", "i32", "bool", "bool"],
    result: "i32",
  },
  llama_init_from_model: { parameters: ["pointer", CONTEXT_PARAMS], result: "pointer" },
  llama_free: { parameters: ["pointer"], result: "void" },
  llama_attach_threadpool: { parameters: ["pointer", "pointer", "pointer"], result: "void" },
  llama_detach_threadpool: { parameters: ["pointer"], result: "void" },
  llama_batch_get_one: { parameters: ["buffer", "i32"], result: BATCH },
  llama_decode: { parameters: ["pointer", BATCH], result: "i32" },
  llama_get_logits_ith: { parameters: ["pointer", "i32"], result: "pointer" },
  llama_get_memory: { parameters: ["pointer"], result: "pointer" },
  llama_memory_clear: { parameters: ["pointer", "bool"], result: "void" },
  llama_n_ctx: { parameters: ["pointer"], result: "u32" },
} as const satisfies Deno.ForeignLibraryInterface;

const GGML_SYMBOLS = {
  ggml_backend_load_all_from_path: { parameters: ["buffer"], result: "void" },
  ggml_backend_dev_by_type: { parameters: ["i32"], result: "pointer" },
} as const satisfies Deno.ForeignLibraryInterface;

const GGML_BASE_SYMBOLS = {
  ggml_threadpool_params_init: { parameters: ["buffer", "i32"], result: "void" },
  ggml_backend_dev_backend_reg: { parameters: ["pointer"], result: "pointer" },
  ggml_backend_reg_get_proc_address: { parameters: ["pointer", "buffer"], result: "pointer" },
  ggml_backend_dev_description: { parameters: ["pointer"], result: "pointer" },
} as const satisfies Deno.ForeignLibraryInterface;

const GGML_BACKEND_DEVICE_TYPE_CPU = 0;

/** ggml KV cache element types the bench tries (ggml.h enum ggml_type). */
export const KV_TYPES = { f32: 0, f16: 1, bf16: 30, q8_0: 8 } as const;
/** A KV cache type name. */
export type KvTypeName = keyof typeof KV_TYPES;

/** A context configuration: the settings llama.cpp users choose between. */
export interface LlamaContextConfig {
  /** tokens the KV cache holds */
  nCtx: number;
  threads: number;
  /** flash attention on or off (AUTO is not used: the bench wants to know which one ran) */
  flashAttn: boolean;
  kvType: KvTypeName;
  /** physical batch (llama.cpp default 512) */
  nUbatch?: number;
}

const cstr = (s: string) => new TextEncoder().encode(s + "\0");

function readCString(p: Deno.PointerValue): string {
  return p === null ? "" : new Deno.UnsafePointerView(p).getCString();
}

/** Where node-llama-cpp's prebuilt linux-x64 binaries live (downloads the npm package if needed). */
export async function llamaBinsDir(): Promise<string> {
  if (Deno.build.os !== "linux" || Deno.build.arch !== "x86_64") {
    throw new Error(
      `the peer bench uses node-llama-cpp's linux-x64 prebuilt; this is ${Deno.build.os}-${Deno.build.arch}`,
    );
  }
  const mod = await import("@node-llama-cpp/linux-x64");
  return `${mod.getBinsDir().binsDir}/linux-x64`;
}

/** The loaded llama.cpp libraries (one per process). */
export class LlamaCpp {
  readonly #llama: Deno.DynamicLibrary<typeof LLAMA_SYMBOLS>;
  readonly #ggml: Deno.DynamicLibrary<typeof GGML_SYMBOLS>;
  readonly #base: Deno.DynamicLibrary<typeof GGML_BASE_SYMBOLS>;
  readonly #logCallback: Deno.UnsafeCallback<{
    parameters: ["i32", "pointer", "pointer"];
    result: "void";
  }>;
  readonly #threadpoolNew: Deno.UnsafeFnPointer<
    { parameters: ["buffer"]; result: "pointer" }
  >;
  readonly #threadpoolFree: Deno.UnsafeFnPointer<{ parameters: ["pointer"]; result: "void" }>;
  readonly #cpu: Deno.DynamicLibrary<
    { ggml_threadpool_pause: { parameters: ["pointer"]; result: "void" } }
  >;
  /** llama.cpp's log lines (load messages: which CPU variant, buffer types) */
  readonly log: string[] = [];
  /** the directory the libraries came from */
  readonly binsDir: string;
  /** llama_print_system_info() */
  readonly systemInfo: string;
  /** the CPU backend device's description and the variant library loaded */
  readonly cpuBackend: string;

  private constructor(binsDir: string) {
    this.binsDir = binsDir;
    this.#base = Deno.dlopen(`${binsDir}/libggml-base.so`, GGML_BASE_SYMBOLS);
    this.#ggml = Deno.dlopen(`${binsDir}/libggml.v0.4.0.so`, GGML_SYMBOLS);
    this.#llama = Deno.dlopen(`${binsDir}/libllama.v0.4.0.so`, LLAMA_SYMBOLS);
    // Logs are collected, not printed. llama.cpp logs from the calling thread during load and
    // context creation (the only times this binding expects a log line).
    this.#logCallback = new Deno.UnsafeCallback(
      { parameters: ["i32", "pointer", "pointer"], result: "void" } as const,
      (_level, text) => {
        const line = readCString(text);
        if (this.log.length < 10000) this.log.push(line);
      },
    );
    this.#llama.symbols.llama_log_set(this.#logCallback.pointer, null);
    this.#ggml.symbols.ggml_backend_load_all_from_path(cstr(binsDir));
    this.#llama.symbols.llama_backend_init();
    const dev = this.#ggml.symbols.ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (dev === null) throw new Error(`llama.cpp found no CPU backend in ${binsDir}`);
    const reg = this.#base.symbols.ggml_backend_dev_backend_reg(dev);
    const proc = (name: string) => {
      const p = this.#base.symbols.ggml_backend_reg_get_proc_address(reg, cstr(name));
      if (p === null) throw new Error(`llama.cpp CPU backend has no ${name}`);
      return p;
    };
    this.#threadpoolNew = new Deno.UnsafeFnPointer(
      proc("ggml_threadpool_new") as Deno.PointerObject<never>,
      { parameters: ["buffer"], result: "pointer" } as const,
    );
    this.#threadpoolFree = new Deno.UnsafeFnPointer(
      proc("ggml_threadpool_free") as Deno.PointerObject<never>,
      { parameters: ["pointer"], result: "void" } as const,
    );
    // ggml_threadpool_pause is exported by the CPU variant library, not offered by proc address.
    const variant = this.log.map((l) => l.match(/loaded CPU backend from (\S+)/)?.[1]).find((x) =>
      x
    );
    if (!variant) throw new Error("llama.cpp did not report which CPU backend library it loaded");
    this.#cpu = Deno.dlopen(
      variant,
      {
        ggml_threadpool_pause: { parameters: ["pointer"], result: "void" },
      } as const,
    );
    this.systemInfo = readCString(this.#llama.symbols.llama_print_system_info()).trim();
    this.cpuBackend = `${readCString(this.#base.symbols.ggml_backend_dev_description(dev))} (${
      variant.split("/").pop()
    })`;
  }

  static #instance: LlamaCpp | undefined;

  /**
   * Loads the libraries once per process.
   * @returns the shared instance
   * @throws Error when the prebuilt package is missing or not for this platform
   */
  static async load(): Promise<LlamaCpp> {
    LlamaCpp.#instance ??= new LlamaCpp(await llamaBinsDir());
    return LlamaCpp.#instance;
  }

  /** @internal symbol table for LlamaModel/LlamaContext */
  get symbols(): Deno.DynamicLibrary<typeof LLAMA_SYMBOLS>["symbols"] {
    return this.#llama.symbols;
  }

  /**
   * Loads a GGUF model (mmap, CPU only).
   * @param path GGUF file
   * @returns the model
   * @throws Error when llama.cpp refuses the file (its log lines are in the message)
   */
  loadModel(path: string): LlamaModel {
    const params = this.#llama.symbols.llama_model_default_params();
    const view = new DataView(params.buffer, params.byteOffset, params.byteLength);
    if (view.getUint8(MP.vocabOnly) !== 0) throw new Error("llama_model_params layout mismatch");
    view.setInt32(MP.nGpuLayers, 0, true);
    const mark = this.log.length;
    const ptr = this.#llama.symbols.llama_model_load_from_file(cstr(path), params);
    if (ptr === null) {
      throw new Error(
        `llama.cpp could not load ${path}:\n${this.log.slice(mark).join("").slice(-3000)}`,
      );
    }
    return new LlamaModel(this, ptr);
  }

  /** @internal a thread pool of n threads, polling (level 50) as llama-server's default */
  newThreadpool(threads: number): Deno.PointerObject {
    const p = new Uint8Array(THREADPOOL_PARAMS_BYTES);
    this.#base.symbols.ggml_threadpool_params_init(p, threads);
    const view = new DataView(p.buffer);
    if (view.getInt32(TP.nThreads, true) !== threads || view.getUint32(TP.poll, true) !== 50) {
      throw new Error("ggml_threadpool_params layout mismatch");
    }
    const tp = this.#threadpoolNew.call(p);
    if (tp === null) throw new Error(`ggml_threadpool_new(${threads}) failed`);
    return tp;
  }

  /** @internal */
  freeThreadpool(tp: Deno.PointerObject): void {
    this.#threadpoolFree.call(tp);
  }

  /** @internal stops a pool's threads polling (the next decode resumes it) */
  pauseThreadpool(tp: Deno.PointerObject): void {
    this.#cpu.symbols.ggml_threadpool_pause(tp);
  }

  /** @internal default context params with the layout checked */
  contextParams(): Uint8Array {
    const params = this.#llama.symbols.llama_context_default_params();
    const v = new DataView(params.buffer, params.byteOffset, params.byteLength);
    const ok = v.getUint32(CP.nCtx, true) === 512 && v.getUint32(CP.nBatch, true) === 2048 &&
      v.getUint32(CP.nUbatch, true) === 512 && v.getUint32(CP.nSeqMax, true) === 1 &&
      v.getInt32(CP.nThreads, true) === 4 && v.getInt32(CP.flashAttnType, true) === -1 &&
      v.getInt32(CP.typeK, true) === 1 && v.getInt32(CP.typeV, true) === 1 &&
      v.getUint8(CP.offloadKqv) === 1 && v.getUint8(CP.noPerf) === 1;
    if (!ok) throw new Error("llama_context_params layout mismatch (llama.h changed?)");
    return params;
  }
}

/** A loaded GGUF model. */
export class LlamaModel {
  readonly lib: LlamaCpp;
  #ptr: Deno.PointerObject | null;
  /** llama_model_size: bytes of the weights as loaded */
  readonly sizeBytes: number;
  readonly nVocab: number;

  /** @internal use LlamaCpp.loadModel */
  constructor(lib: LlamaCpp, ptr: Deno.PointerObject) {
    this.lib = lib;
    this.#ptr = ptr;
    this.sizeBytes = Number(lib.symbols.llama_model_size(ptr));
    this.nVocab = lib.symbols.llama_vocab_n_tokens(lib.symbols.llama_model_get_vocab(ptr));
  }

  #handle(): Deno.PointerObject {
    if (this.#ptr === null) throw new Error("LlamaModel used after free()");
    return this.#ptr;
  }

  /**
   * Tokenizes with llama.cpp's own tokenizer (no BOS added, special tokens parsed).
   * @param text input
   * @returns token ids
   */
  tokenize(text: string): number[] {
    const bytes = new TextEncoder().encode(text);
    const vocab = this.lib.symbols.llama_model_get_vocab(this.#handle());
    const out = new Int32Array(bytes.length + 16);
    const n = this.lib.symbols.llama_tokenize(
      vocab,
      bytes,
      bytes.length,
      new Uint8Array(out.buffer),
      out.length,
      false,
      true,
    );
    if (n < 0) throw new Error(`llama_tokenize needs ${-n} tokens`);
    return [...out.subarray(0, n)];
  }

  /**
   * Creates a context with its own persistent thread pool.
   * @param cfg context size, threads, flash attention, KV type, ubatch
   * @returns the context
   */
  createContext(cfg: LlamaContextConfig): LlamaContext {
    const params = this.lib.contextParams();
    const v = new DataView(params.buffer, params.byteOffset, params.byteLength);
    v.setUint32(CP.nCtx, cfg.nCtx, true);
    v.setUint32(CP.nBatch, Math.max(cfg.nCtx, 512), true);
    v.setUint32(CP.nUbatch, cfg.nUbatch ?? 512, true);
    v.setInt32(CP.nThreads, cfg.threads, true);
    v.setInt32(CP.nThreadsBatch, cfg.threads, true);
    v.setInt32(CP.flashAttnType, cfg.flashAttn ? 1 : 0, true);
    v.setInt32(CP.typeK, KV_TYPES[cfg.kvType], true);
    v.setInt32(CP.typeV, KV_TYPES[cfg.kvType], true);
    const mark = this.lib.log.length;
    const ctx = this.lib.symbols.llama_init_from_model(this.#handle(), params);
    if (ctx === null) {
      throw new Error(
        `llama_init_from_model failed (${JSON.stringify(cfg)}):\n${
          this.lib.log.slice(mark).join("").slice(-2000)
        }`,
      );
    }
    const tp = this.lib.newThreadpool(cfg.threads);
    this.lib.symbols.llama_attach_threadpool(ctx, tp, null);
    return new LlamaContext(this, ctx, tp, cfg);
  }

  /** Frees the model (its contexts must be freed first). Idempotent. */
  free(): void {
    if (this.#ptr !== null) this.lib.symbols.llama_model_free(this.#ptr);
    this.#ptr = null;
  }
}

/** One sequence's context: KV cache, thread pool, logits. */
export class LlamaContext {
  readonly model: LlamaModel;
  readonly config: LlamaContextConfig;
  #ptr: Deno.PointerObject | null;
  #tp: Deno.PointerObject | null;

  /** @internal use LlamaModel.createContext */
  constructor(
    model: LlamaModel,
    ptr: Deno.PointerObject,
    tp: Deno.PointerObject,
    config: LlamaContextConfig,
  ) {
    this.model = model;
    this.#ptr = ptr;
    this.#tp = tp;
    this.config = config;
  }

  #handle(): Deno.PointerObject {
    if (this.#ptr === null) throw new Error("LlamaContext used after free()");
    return this.#ptr;
  }

  /** Empties the KV cache (the next prefill starts at position 0). */
  clear(): void {
    const s = this.model.lib.symbols;
    s.llama_memory_clear(s.llama_get_memory(this.#handle()), true);
  }

  /**
   * Appends tokens (one llama_decode; llama.cpp splits it into ubatches) and returns the last
   * token's logits, as kvrelay's prefill does.
   * @param ids tokens
   * @returns logits of the last token (a copy)
   * @throws Error when llama_decode fails
   */
  eval(ids: ArrayLike<number>): Float32Array {
    const s = this.model.lib.symbols;
    const ctx = this.#handle();
    const tokens = Int32Array.from(ids);
    const batch = s.llama_batch_get_one(new Uint8Array(tokens.buffer), tokens.length);
    const rc = s.llama_decode(ctx, batch);
    if (rc !== 0) throw new Error(`llama_decode returned ${rc} for ${tokens.length} tokens`);
    const p = s.llama_get_logits_ith(ctx, -1);
    if (p === null) throw new Error("llama_get_logits_ith returned NULL");
    const n = this.model.nVocab;
    return new Float32Array(Deno.UnsafePointerView.getArrayBuffer(p, n * 4).slice(0));
  }

  /** Stops the pool's threads polling until the next eval (so they do not steal the CPU). */
  pause(): void {
    if (this.#tp) this.model.lib.pauseThreadpool(this.#tp);
  }

  /** Frees the context and its thread pool. Idempotent. */
  free(): void {
    if (this.#ptr !== null) {
      this.model.lib.symbols.llama_detach_threadpool(this.#ptr);
      this.model.lib.symbols.llama_free(this.#ptr);
      this.#ptr = null;
    }
    if (this.#tp !== null) this.model.lib.freeThreadpool(this.#tp);
    this.#tp = null;
  }
}
