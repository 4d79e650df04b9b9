// The `onnx` projector kind: a learned KV projector run by onnxruntime-node (loaded lazily, so
// the linear kind never pulls the 290 MB package in). Source cache → native de-rotation →
// ONNX session (inputs/outputs named in projector.json) → native re-rotation. No fitting here.

import type { ModelConfig } from "../model/mod.ts";
import type { NativeLibrary } from "../native/mod.ts";
import type { ProjectorMeta } from "./artifact.ts";
import { ProjectorFormatError } from "./errors.ts";
import { type CacheBlock, featureWidth, kvFromFeatures, kvToFeatures } from "./native.ts";

// Minimal structural types of the onnxruntime-node API this module uses.
interface OrtTensor {
  readonly dims: readonly number[];
  readonly data: unknown;
  readonly type: string;
}
interface OrtSession {
  readonly inputNames: readonly string[];
  readonly outputNames: readonly string[];
  run(feeds: Record<string, OrtTensor>): Promise<Record<string, OrtTensor>>;
  release(): Promise<void>;
}
interface OrtModule {
  InferenceSession: { create(path: string, opts?: Record<string, unknown>): Promise<OrtSession> };
  Tensor: new (type: "float32", data: Float32Array, dims: number[]) => OrtTensor;
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
   * @throws ProjectorFormatError when onnxruntime-node cannot load or the graph's names differ
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
    let ort: OrtModule;
    try {
      // a non-literal specifier keeps onnxruntime-node (and the Node typings it references) out of
      // type checking; deno.json's import map still resolves it at run time
      const specifier = "onnxruntime-node";
      ort = (await import(specifier)) as unknown as OrtModule;
    } catch (e) {
      throw new ProjectorFormatError(
        `onnxruntime-node failed to load: ${(e as Error).message}`,
        path,
      );
    }
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
