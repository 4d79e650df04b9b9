// NativeModel: weights loaded by libkvrelay (kvr_model) from a lib/model Checkpoint — builds the
// params struct and tensor table, loads synchronously, and creates sequences. Freeing the model
// frees its sequences first (deferred while one has a call in flight).

import { type Checkpoint, mapWeights, type ModelConfig } from "../model/mod.ts";
import { checkInt, quoteValue, U32_MAX } from "./check.ts";
import { assertKvDtype, type KvDtype } from "./dtype.ts";
import { BACKEND_CODE, WEIGHTS_CODE } from "./abi.ts";
import { type BackendChoice, cString, noteAutoFallback, resolveBackend } from "./backend.ts";
import {
  checkCpuKernel,
  type CpuKernel,
  encodeModelParams,
  encodePaths,
  encodeTensorTable,
  type NativeBackend,
  type WeightFormat,
} from "./layout.ts";
import { type NativeLibrary, openNativeLibrary } from "./library.ts";
import { NativeSequence } from "./sequence.ts";
import { KvPool } from "./kv_pool.ts";
import {
  type BatchItem,
  type BatchResult,
  type DecodeStepsItem,
  type DecodeStepsResult,
  runBatchDecodeSteps,
  runBatchStep,
} from "./batch.ts";
import { NativeSampler, type NativeSamplingOptions } from "./sampler.ts";

/** Options for NativeModel.load. */
export interface NativeModelOptions {
  /** KV cache element type (default "f32": exact; "bf16"/"f16" halve cache memory) */
  kvDtype?: KvDtype;
  /** worker threads; 0 or undefined = all available cores */
  threads?: number;
  /** linear-weight format in memory (default "bf16" = as stored; "q8" = 8-bit, "q4" = 4-bit;
   *  q8/q4 CPU only) */
  weights?: WeightFormat;
  /** CPU kernel paths the model's computations may use (default "auto": every path the CPU has);
   *  "generic", "avx2", "avxvnni" or "avx512" narrow them (kvrelay.h kvr_cpu_kernel), so one
   *  process checks each path its CPU runs. CPU backend only (CUDA: anything but "auto" fails). */
  cpuKernel?: CpuKernel;
  /** compute backend (default "cpu"); "auto" = CUDA when its probe succeeds, else the CPU (the
   *  probe's reason is logged once per process, see noteAutoFallback) */
  backend?: BackendChoice;
  /** log auto's CPU fallback (once per process; default true). The CLI's implicit default
   *  backend sets false: there the CPU on a machine without a GPU is no news. */
  logAutoFallback?: boolean;
  /** device ordinal for the backend (CUDA; default 0) */
  device?: number;
  /** library to use (default openNativeLibrary()) */
  lib?: NativeLibrary;
}

/** A model whose weights live in native memory. */
export class NativeModel {
  /** the checkpoint's config */
  readonly config: ModelConfig;
  /** KV cache element type of every sequence */
  readonly kvDtype: KvDtype;
  /** worker threads the native kernels use (resolved) */
  readonly threads: number;
  /** resident bytes of the weights in compute layout (BF16 checkpoint weights stay 2 bytes) */
  readonly weightBytes: number;
  /** the backend the model runs on (kvr_model_backend) */
  readonly backend: NativeBackend;
  /** its device ordinal */
  readonly device: number;
  /** one-line description of the device */
  readonly deviceInfo: string;
  readonly #lib: NativeLibrary;
  #ptr: Deno.PointerObject | null;
  #freeRequested = false;
  readonly #seqs = new Set<NativeSequence>();
  readonly #pools = new Set<KvPool>();

  private constructor(
    lib: NativeLibrary,
    ptr: Deno.PointerObject,
    config: ModelConfig,
    kvDtype: KvDtype,
  ) {
    this.#lib = lib;
    this.#ptr = ptr;
    this.config = config;
    this.kvDtype = kvDtype;
    this.threads = lib.symbols.kvr_model_threads(ptr);
    this.weightBytes = Number(lib.symbols.kvr_model_weight_bytes(ptr));
    const kind = new Uint32Array(1), dev = new Uint32Array(1), info = new Uint8Array(512);
    lib.check(
      lib.symbols.kvr_model_backend(ptr, kind, dev, info, BigInt(info.length)),
      "kvr_model_backend",
    );
    const name = (Object.keys(BACKEND_CODE) as NativeBackend[]).find((k) =>
      BACKEND_CODE[k] === kind[0]
    );
    if (name === undefined) throw new Error(`kvr_model_backend: unknown backend ${kind[0]}`);
    this.backend = name;
    this.device = dev[0];
    this.deviceInfo = cString(info);
  }

  /**
   * Loads a checkpoint's weights into native memory (mmap + convert to the compute layout: BF16
   * weights stay bf16, others become f32; synchronous).
   * @param checkpoint from lib/model loadCheckpoint
   * @param opts kvDtype, threads, weights, cpuKernel, backend, device, lib
   * @returns the model
   * @throws TypeError/RangeError for bad options; ModelFormatError when the checkpoint's tensors
   *   do not match its config; EngineError when the native load fails (UNSUPPORTED for a
   *   backend this build or machine cannot run)
   */
  static load(checkpoint: Checkpoint, opts: NativeModelOptions = {}): NativeModel {
    const call = NativeModel.#prepare(checkpoint, opts);
    const status = call.lib.symbols.kvr_model_load(...call.args);
    return NativeModel.#finish(call, status);
  }

  /**
   * Like {@link NativeModel.load}, but the native load (mmap, conversion, packing) runs on a
   * worker thread, so the JS thread keeps serving (health probes answer while a model loads).
   * Keep the checkpoint alive until the promise settles (its buffers are referenced meanwhile).
   * @param checkpoint from lib/model loadCheckpoint
   * @param opts kvDtype, threads, weights, cpuKernel, backend, device, lib
   * @returns the model
   * @throws the same errors as {@link NativeModel.load}
   */
  static async loadAsync(
    checkpoint: Checkpoint,
    opts: NativeModelOptions = {},
  ): Promise<NativeModel> {
    const call = NativeModel.#prepare(checkpoint, opts);
    const status = await call.lib.symbols.kvr_model_load_nonblocking(...call.args);
    if (status !== 0) {
      // The message is thread-local to the worker that ran the load. Failures are found before
      // or while reading (bad params, files, out of memory), so repeating the load on this
      // thread is cheap and reports the same failure with its message (or, if it was
      // transient, loads the model).
      return NativeModel.#finish(call, call.lib.symbols.kvr_model_load(...call.args));
    }
    return NativeModel.#finish(call, status);
  }

  static #prepare(checkpoint: Checkpoint, opts: NativeModelOptions) {
    const kvDtype = opts.kvDtype ?? "f32";
    assertKvDtype(kvDtype, "kvDtype");
    const threads = checkInt("threads", opts.threads ?? 0, 0, 4096);
    const weights = opts.weights ?? "bf16";
    if (!Object.hasOwn(WEIGHTS_CODE, weights)) {
      throw new TypeError(
        `weights must be one of ${Object.keys(WEIGHTS_CODE).join(", ")}, got ${
          quoteValue(weights)
        }`,
      );
    }
    const cpuKernel = checkCpuKernel("cpuKernel", opts.cpuKernel ?? "auto");
    const choice = opts.backend ?? "cpu";
    if (!(choice in BACKEND_CODE) && choice !== "auto") {
      throw new TypeError(`backend must be "auto", "cpu" or "cuda", got ${quoteValue(choice)}`);
    }
    let device = checkInt("device", opts.device ?? 0, 0, 0x7fffffff);
    const lib = opts.lib ?? openNativeLibrary();
    let backend: NativeBackend;
    if (choice === "auto") {
      const r = resolveBackend("auto", device, lib);
      if (r.fallbackReason !== undefined && opts.logAutoFallback !== false) {
        noteAutoFallback(r.fallbackReason);
      }
      backend = r.backend;
      device = r.device;
    } else {
      backend = choice;
    }
    const entries = mapWeights(checkpoint.config, checkpoint.tensors, checkpoint.dir);
    const params = encodeModelParams(
      checkpoint.config,
      kvDtype,
      threads,
      backend,
      device,
      weights,
      cpuKernel,
    );
    const paths = encodePaths(checkpoint.files);
    const table = encodeTensorTable(entries, checkpoint.files);
    const out = new BigUint64Array(1);
    const args = [
      params,
      paths,
      BigInt(paths.length),
      checkpoint.files.length,
      table,
      BigInt(entries.length),
      out,
    ] as const;
    return { lib, args, out, config: checkpoint.config, kvDtype };
  }

  static #finish(
    call: { lib: NativeLibrary; out: BigUint64Array; config: ModelConfig; kvDtype: KvDtype },
    status: number,
  ): NativeModel {
    call.lib.check(status, "kvr_model_load");
    const ptr = Deno.UnsafePointer.create(call.out[0]);
    if (ptr === null) throw new Error("kvr_model_load returned OK but no model");
    return new NativeModel(call.lib, ptr, call.config, call.kvDtype);
  }

  /**
   * Whether the model's device is still usable (kvr_model_health): a CUDA kernel fault leaves the
   * device context unusable, every later call fails and the model must be reloaded.
   * @returns null while usable (always for the CPU), else the reason
   * @throws Error when the model has been freed
   */
  health(): string | null {
    if (this.#freeRequested || this.#ptr === null) {
      throw new Error("NativeModel.health(): the model has been freed");
    }
    const info = new Uint8Array(512);
    const st = this.#lib.symbols.kvr_model_health(this.#ptr, info, BigInt(info.length));
    return st === 0 ? null : cString(info);
  }

  /**
   * Creates a sequence with an empty KV cache.
   * @param capacity tokens the cache holds (>= 1)
   * @returns the sequence (free it, or use `using`)
   * @throws RangeError when capacity < 1 or not a u32; EngineError (e.g. OUT_OF_MEMORY) from
   *   native; Error when the model has been freed
   */
  createSequence(capacity: number): NativeSequence {
    if (this.#freeRequested || this.#ptr === null) {
      throw new Error("NativeModel.createSequence(): the model has been freed");
    }
    if (typeof capacity !== "number") {
      throw new TypeError(`capacity must be a number, got ${quoteValue(capacity)}`);
    }
    checkInt("capacity", capacity, 1, U32_MAX);
    const out = new BigUint64Array(1);
    this.#lib.check(this.#lib.symbols.kvr_seq_create(this.#ptr, capacity, out), "kvr_seq_create");
    const ptr = Deno.UnsafePointer.create(out[0]);
    if (ptr === null) throw new Error("kvr_seq_create returned OK but no sequence");
    const seq = new NativeSequence(this, this.#lib, ptr, (s) => {
      this.#seqs.delete(s);
      this.#maybeRelease();
    });
    this.#seqs.add(seq);
    return seq;
  }

  /**
   * Creates a paged KV pool for this model's sequences (see {@link KvPool}).
   * @param blocks number of blocks (>= 1)
   * @param blockTokens positions per block, a power of two in [8, 1024] (default 16)
   * @returns the pool (freed with the model, or by its own free())
   * @throws RangeError for bad sizes; EngineError (OUT_OF_MEMORY) from native; Error when freed
   */
  createKvPool(blocks: number, blockTokens = 16): KvPool {
    if (this.#freeRequested || this.#ptr === null) {
      throw new Error("NativeModel.createKvPool(): the model has been freed");
    }
    checkInt("blocks", blocks, 1, U32_MAX);
    checkInt("blockTokens", blockTokens, 8, 1024);
    if ((blockTokens & (blockTokens - 1)) !== 0) {
      throw new RangeError(`blockTokens must be a power of two in [8, 1024], got ${blockTokens}`);
    }
    const out = new BigUint64Array(1);
    this.#lib.check(
      this.#lib.symbols.kvr_kv_pool_create(this.#ptr, blocks, blockTokens, out),
      "kvr_kv_pool_create",
    );
    const ptr = Deno.UnsafePointer.create(out[0]);
    if (ptr === null) throw new Error("kvr_kv_pool_create returned OK but no pool");
    const pool = new KvPool(
      this,
      this.#lib,
      ptr,
      (capacity) => this.#createPaged(ptr, capacity),
      () => {
        this.#pools.delete(pool);
      },
    );
    this.#pools.add(pool);
    return pool;
  }

  /**
   * One native step over several sequences of this model (see {@link BatchItem}): projections
   * as one GEMM over every new token, attention per sequence, logits only where wanted. Each
   * sequence's result equals its own prefill of the same tokens (up to summation order).
   * @param items sequences and their new tokens, distinct sequences
   * @returns per item its (vocab) logits, its natively sampled token (items with `sample`; an
   *   EngineError for a row without a finite logit), or null where neither was asked
   * @throws TypeError/RangeError before FFI for bad items; EngineError (POOL_EXHAUSTED when a
   *   paged sequence cannot grow — nothing changes then); Error when a sequence or sampler is
   *   freed or busy
   */
  batchStep(items: readonly BatchItem[]): Promise<BatchResult[]> {
    if (this.#freeRequested || this.#ptr === null) {
      return Promise.reject(new Error("NativeModel.batchStep(): the model has been freed"));
    }
    return runBatchStep(this.#lib, this, items);
  }

  /**
   * Up to `steps` decode steps of the same sequences in one call (a scheduler's burst): the
   * first appends each item's token, each later one what the step before sampled; every step
   * samples natively. The same tokens and caches as `steps` calls of {@link batchStep}.
   * @param items sequences, their first tokens and samplers, distinct sequences
   * @param steps most steps; fewer run when a step fails natively (e.g. POOL_EXHAUSTED) or a row
   *   has no finite logit
   * @returns per item its sampled tokens (each but the last is in its cache), or the EngineError
   *   of its first draw
   * @throws as {@link batchStep} when the first step fails (nothing changes then)
   */
  batchDecodeSteps(items: readonly DecodeStepsItem[], steps: number): Promise<DecodeStepsResult[]> {
    if (this.#freeRequested || this.#ptr === null) {
      return Promise.reject(new Error("NativeModel.batchDecodeSteps(): the model has been freed"));
    }
    return runBatchDecodeSteps(this.#lib, this, items, steps);
  }

  /**
   * A native sampler from this model's library (for batchStep items' `sample`).
   * @param opts resolved sampling options (lib/engine validateSampling plus a seed)
   * @returns the sampler (the caller frees it)
   * @throws EngineError when an option is rejected
   */
  createSampler(opts: NativeSamplingOptions): NativeSampler {
    return NativeSampler.create(opts, this.#lib);
  }

  #createPaged(pool: Deno.PointerObject, capacity: number): NativeSequence {
    if (this.#freeRequested || this.#ptr === null) {
      throw new Error("KvPool.createSequence(): the model has been freed");
    }
    checkInt("capacity", capacity, 1, U32_MAX);
    const out = new BigUint64Array(1);
    this.#lib.check(
      this.#lib.symbols.kvr_seq_create_paged(pool, capacity, out),
      "kvr_seq_create_paged",
    );
    const ptr = Deno.UnsafePointer.create(out[0]);
    if (ptr === null) throw new Error("kvr_seq_create_paged returned OK but no sequence");
    const seq = new NativeSequence(this, this.#lib, ptr, (s) => {
      this.#seqs.delete(s);
      this.#maybeRelease();
    });
    this.#seqs.add(seq);
    return seq;
  }

  #maybeRelease(): void {
    if (this.#freeRequested && this.#seqs.size === 0 && this.#ptr !== null) {
      this.#lib.symbols.kvr_model_free(this.#ptr);
      this.#ptr = null;
    }
  }

  /** Frees the model and all its sequences (those with a call in flight when it settles). Idempotent. */
  free(): void {
    if (this.#freeRequested) return;
    this.#freeRequested = true;
    for (const s of [...this.#seqs]) s.free();
    for (const p of [...this.#pools]) p.free();
    this.#maybeRelease();
  }

  /** Same as free(). */
  [Symbol.dispose](): void {
    this.free();
  }
}
