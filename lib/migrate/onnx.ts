// The `onnx` projector kind: a learned KV projector run by onnxruntime-node, an optional part
// (./onnx_runtime.ts) loaded only when an onnx projector is opened, so the linear kind and the
// functions' module graph never load the 290 MB package.
// Source cache → native de-rotation → ONNX session (inputs/outputs named in projector.json) →
// native re-rotation. No fitting here.

import type { ModelConfig } from "../model/mod.ts";
import type { NativeLibrary } from "../native/mod.ts";
import type { ProjectorMeta } from "./artifact.ts";
import { OnnxRuntimeMissingError, ProjectorFormatError } from "./errors.ts";
import { type CacheBlock, featureWidth, kvFromFeatures, kvToFeatures } from "./native.ts";

// Minimal structural types of the onnxruntime-node API this module uses (onnx_runtime.ts checks
// the real module against them).
/** An onnxruntime tensor. */
export interface OrtTensor {
  readonly dims: readonly number[];
  readonly data: unknown;
  readonly type: string;
}
/** An onnxruntime inference session. */
export interface OrtSession {
  readonly inputNames: readonly string[];
  readonly outputNames: readonly string[];
  run(feeds: Record<string, OrtTensor>): Promise<Record<string, OrtTensor>>;
  release(): Promise<void>;
}
/** The part of onnxruntime-node's API used here. */
export interface OrtModule {
  InferenceSession: { create(path: string, opts?: Record<string, unknown>): Promise<OrtSession> };
  Tensor: new (type: "float32", data: Float32Array, dims: number[]) => OrtTensor;
}

/** The optional part's module, as a URL computed at run time: the functions' module graph does
 *  not contain it, so an installation without onnxruntime-node (an image built without
 *  KVRELAY_ONNX=1) type-checks, caches and starts, and only an onnx projector needs it. */
const ONNX_RUNTIME_MODULE = new URL("./onnx_runtime.ts", import.meta.url).href;

let runtime: Promise<OrtModule> | undefined;

/**
 * Loads the optional onnxruntime-node part once per process.
 * @param path the .onnx file that needs it (named in the error)
 * @returns the module
 * @throws OnnxRuntimeMissingError when it is not installed (e.g. a `--cached-only` run whose
 *   cache lacks it) or does not load
 */
export async function loadOnnxRuntime(path?: string): Promise<OrtModule> {
  runtime ??= import(ONNX_RUNTIME_MODULE).then((m) => m.default as OrtModule);
  try {
    return await runtime;
  } catch (e) {
    runtime = undefined;
    throw new OnnxRuntimeMissingError((e as Error).message.split("\n")[0], path);
  }
}

/** An ONNX KV projector session with its names and the two models' geometry. */
export class OnnxKernel {
  readonly #ort: OrtModule;
  readonly #session: OrtSession;
  readonly #meta: ProjectorMeta;
  readonly #source: ModelConfig;
  readonly #target: ModelConfig;
  readonly #lib?: NativeLibrary;

  private constructor(
    ort: OrtModule,
    session: OrtSession,
    meta: ProjectorMeta,
    source: ModelConfig,
    target: ModelConfig,
    lib?: NativeLibrary,
  ) {
    this.#ort = ort;
    this.#session = session;
    this.#meta = meta;
    this.#source = source;
    this.#target = target;
    this.#lib = lib;
  }

  /**
   * Opens the ONNX file named in projector.json and checks its input/output names.
   * @param dir projector directory
   * @param meta metadata (kind onnx)
   * @param source source config (geometry already checked against meta)
   * @param target target config
   * @param lib native library for the RoPE transforms
   * @returns the kernel
   * @throws OnnxRuntimeMissingError when the optional onnxruntime-node part is not installed
   * @throws ProjectorFormatError when the graph does not open or its names differ
   */
  static async open(
    dir: string,
    meta: ProjectorMeta,
    source: ModelConfig,
    target: ModelConfig,
    lib?: NativeLibrary,
  ): Promise<OnnxKernel> {
    const spec = meta.onnx!;
    const path = `${dir}/${spec.file}`;
    const ort = await loadOnnxRuntime(path);
    let session: OrtSession;
    try {
      session = await ort.InferenceSession.create(path, {
        intraOpNumThreads: 1,
        interOpNumThreads: 1,
      });
    } catch (e) {
      throw new ProjectorFormatError(`cannot open ONNX model: ${(e as Error).message}`, path);
    }
    const want = [spec.inputs.k, spec.inputs.v], got = [...session.inputNames];
    const wantOut = [spec.outputs.k, spec.outputs.v], gotOut = [...session.outputNames];
    if (want.some((n) => !got.includes(n)) || wantOut.some((n) => !gotOut.includes(n))) {
      await session.release();
      throw new ProjectorFormatError(
        `graph inputs ${JSON.stringify(got)} / outputs ${
          JSON.stringify(gotOut)
        } do not include projector.json's ${JSON.stringify(want)} / ${JSON.stringify(wantOut)}`,
        path,
      );
    }
    return new OnnxKernel(ort, session, meta, source, target, lib);
  }

  /**
   * Projects a source cache block through the ONNX graph.
   * @param startPos position of the first token (same in both models)
   * @param src source cache block
   * @returns target cache block, keys post-RoPE
   * @throws ProjectorFormatError when the graph returns the wrong shape
   */
  async apply(startPos: number, src: CacheBlock): Promise<CacheBlock> {
    const T = src.tokens, ns = featureWidth(this.#source), nt = featureWidth(this.#target);
    const f = kvToFeatures(this.#source, startPos, T, src.k, src.v, this.#lib);
    const spec = this.#meta.onnx!;
    const out = await this.#session.run({
      [spec.inputs.k]: new this.#ort.Tensor("float32", f.k, [T, ns]),
      [spec.inputs.v]: new this.#ort.Tensor("float32", f.v, [T, ns]),
    });
    const get = (name: string): Float32Array => {
      const t = out[name];
      if (
        !t || t.type !== "float32" || !(t.data instanceof Float32Array) || t.data.length !== T * nt
      ) {
        throw new ProjectorFormatError(
          `output ${name} has dims ${JSON.stringify(t?.dims)}, expected [${T}, ${nt}] float32`,
        );
      }
      return t.data;
    };
    const r = kvFromFeatures(
      this.#target,
      startPos,
      T,
      get(spec.outputs.k),
      get(spec.outputs.v),
      this.#lib,
    );
    return { k: r.k, v: r.v, tokens: T };
  }

  /** Releases the session. */
  async free(): Promise<void> {
    await this.#session.release();
  }
}
