// Engine integration: export a NativeSequence's KV as a snapshot (bytes or stream) and import a
// snapshot into a fresh, ready sequence of a LoadedModel, refusing foreign snapshots (model or
// tokenizer fingerprint, geometry) before any payload is decoded or any KV is allocated.
// Not the byte format (format.ts/stream.ts) nor generation (lib/engine continueFrom).

import type { LoadedModel } from "../engine/mod.ts";
import { MAX_SEQUENCE_TOKENS } from "../engine/mod.ts";
import type { ModelConfig } from "../model/mod.ts";
import type { NativeSequence } from "../native/mod.ts";
import { SnapshotError } from "./errors.ts";
import type { SnapshotGeometry, SnapshotHeader } from "./format.ts";
import type { HmacKey, KeyRing } from "./hmac.ts";
import { nativeSink, nativeSource } from "./native_chunk.ts";
import { NativeKvCodec } from "./native_codec.ts";
import {
  decodeSnapshot,
  type EncodeOptions,
  encodeSnapshot,
  encodeSnapshotStream,
  type SnapshotMeta,
} from "./stream.ts";

const ARCH_CODES: Record<ModelConfig["family"], number> = { llama: 1, qwen2: 2, qwen3: 3 };

/**
 * The snapshot geometry of a model config (architecture code, layers, kv heads, head dim, RoPE).
 * @returns geometry as stored in the header
 */
export function geometryOf(config: ModelConfig): SnapshotGeometry {
  const rs = config.ropeScaling;
  return {
    architecture: ARCH_CODES[config.family],
    numLayers: config.numLayers,
    numKvHeads: config.numKvHeads,
    headDim: config.headDim,
    rope: {
      theta: config.ropeTheta,
      scaling: rs === null ? 0 : rs.type === "linear" ? 1 : 2,
      factor: rs?.factor ?? 1,
      lowFreqFactor: rs?.type === "llama3" ? rs.lowFreqFactor : 0,
      highFreqFactor: rs?.type === "llama3" ? rs.highFreqFactor : 0,
      originalMaxPosition: rs?.type === "llama3" ? rs.originalMaxPosition : 0,
    },
  };
}

let sharedCodec: NativeKvCodec | null = null;

/**
 * The native q8/q4 codec over the default library (opened on first use, then shared).
 * @returns the codec
 * @throws Error when libkvrelay cannot be opened
 */
export function defaultKvCodec(): NativeKvCodec {
  sharedCodec ??= new NativeKvCodec();
  return sharedCodec;
}

/** Options of exportSnapshot. */
export interface ExportOptions {
  /** Ids of the tokens in the sequence, one per position [0, seq.length) (or [start, end)). */
  tokens: ArrayLike<number>;
  /** Ids that follow without exported KV: the importer prefills them (default none). */
  pending?: ArrayLike<number>;
  /** First position to export (default 0); the header records it as the position offset. */
  start?: number;
  /** End position, exclusive (default seq.length). */
  end?: number;
  /** Payload encoding (default: the cache's own dtype, lossless). */
  encoding?: EncodeOptions["encoding"];
  /** Tokens per chunk (default 256). */
  chunkTokens?: number;
  /** q4 group size (default 32). */
  groupSize?: number;
  /** HMAC-SHA256 signing key and its id. */
  sign?: { keyId: string; key: HmacKey };
  /** Where the KV came from when not this model's own prefill (format 1.1 provenance block). */
  provenance?: SnapshotMeta["provenance"];
}

function exportArgs(
  model: LoadedModel,
  seq: NativeSequence,
  opts: ExportOptions,
): [SnapshotMeta, EncodeOptions] {
  if (seq.model !== model.native) {
    throw new TypeError(`exportSnapshot(): the sequence does not belong to model ${model.name}`);
  }
  const start = opts.start ?? 0;
  const end = opts.end ?? seq.length;
  if (!Number.isInteger(start) || !Number.isInteger(end) || start < 0 || end < start) {
    throw new RangeError(`exportSnapshot(): bad range [${start}, ${end})`);
  }
  if (end > seq.length) {
    throw new RangeError(`exportSnapshot(): end ${end} exceeds the sequence length ${seq.length}`);
  }
  if (opts.tokens.length !== end - start) {
    throw new RangeError(
      `exportSnapshot(): ${opts.tokens.length} token ids for ${
        end - start
      } positions [${start}, ${end})`,
    );
  }
  const meta: SnapshotMeta = {
    modelFingerprint: model.fingerprint,
    tokenizerFingerprint: model.tokenizer.fingerprint,
    geometry: geometryOf(model.native.config),
    cacheDtype: model.native.kvDtype,
    tokenIds: opts.tokens,
    pendingTokenIds: opts.pending,
    positionOffset: start,
    provenance: opts.provenance,
  };
  const enc: EncodeOptions = {
    encoding: opts.encoding,
    chunkTokens: opts.chunkTokens,
    groupSize: opts.groupSize,
    sign: opts.sign,
  };
  return [meta, enc];
}

/**
 * Exports a sequence's KV as a snapshot stream: the header leaves before any chunk is encoded;
 * chunks are read from the sequence as the consumer pulls. Do not modify `seq` until the stream
 * has ended.
 * @param model the model `seq` belongs to (fingerprints come from it)
 * @param seq the sequence
 * @param opts token ids, range, encoding, chunk size, signing
 * @returns a stream of snapshot bytes
 * @throws TypeError/RangeError for inconsistent arguments (synchronously)
 */
export function exportSnapshotStream(
  model: LoadedModel,
  seq: NativeSequence,
  opts: ExportOptions,
): ReadableStream<Uint8Array> {
  const [meta, enc] = exportArgs(model, seq, opts);
  return encodeSnapshotStream(nativeSource(seq), meta, enc);
}

/**
 * Exports a sequence's KV as one snapshot byte array (see exportSnapshotStream).
 * @returns the snapshot bytes
 * @throws TypeError/RangeError for inconsistent arguments; EngineError from KV reads
 */
export function exportSnapshot(
  model: LoadedModel,
  seq: NativeSequence,
  opts: ExportOptions,
): Promise<Uint8Array> {
  const [meta, enc] = exportArgs(model, seq, opts);
  return encodeSnapshot(nativeSource(seq), meta, enc);
}

/** Options of importSnapshot. */
export interface ImportOptions {
  /** Authenticate: keys by id; `required` (default true) refuses unsigned snapshots. */
  verify?: { keys: KeyRing; required?: boolean };
  /** Maximum snapshot bytes (default 2 GiB). */
  maxBytes?: number;
  /** Extra capacity beyond the snapshot's tokens for generation (default 256). */
  reserve?: number;
  /** Most tokens (KV + pending + reserve) a snapshot may make us allocate (default 32768). */
  maxTokens?: number;
  /** Prefill the pending tokens after import (default true): `logits` is then set. */
  prefillPending?: boolean;
  /** Makes the target sequence of `capacity` tokens (default: a contiguous one of the model;
   *  a serving tier passes its KV pool's createSequence for a paged one). */
  createSequence?: (capacity: number) => NativeSequence;
}

/** A restored sequence. */
export interface ImportedSnapshot {
  /** Holds every KV token, plus the pending tokens when they were prefilled. */
  sequence: NativeSequence;
  /** Ids of every token the snapshot describes: KV tokens then pending tokens. */
  tokenIds: number[];
  /** Logits after the last token (set when pending tokens were prefilled), (vocab) f32. */
  logits: Float32Array | null;
  header: SnapshotHeader;
}

function sameRope(a: SnapshotGeometry["rope"], b: SnapshotGeometry["rope"]): boolean {
  return a.theta === b.theta && a.scaling === b.scaling && a.factor === b.factor &&
    a.lowFreqFactor === b.lowFreqFactor && a.highFreqFactor === b.highFreqFactor &&
    a.originalMaxPosition === b.originalMaxPosition;
}

/**
 * Checks that a snapshot header belongs to `model`: model and tokenizer fingerprints, then the
 * geometry field by field, then token ids < vocab.
 * @throws SnapshotError fingerprint (foreign snapshot) or bounds (token id)
 */
export function checkCompatible(model: LoadedModel, header: SnapshotHeader): void {
  if (header.modelFingerprint !== model.fingerprint.toLowerCase()) {
    throw new SnapshotError(
      "fingerprint",
      `snapshot was made by model ${header.modelFingerprint.slice(0, 16)}…, not ${model.name} (${
        model.fingerprint.slice(0, 16)
      }…)`,
    );
  }
  if (header.tokenizerFingerprint !== model.tokenizer.fingerprint.toLowerCase()) {
    throw new SnapshotError(
      "fingerprint",
      `snapshot tokenizer ${
        header.tokenizerFingerprint.slice(0, 16)
      }… differs from ${model.name}'s ${model.tokenizer.fingerprint.slice(0, 16)}…`,
    );
  }
  const want = geometryOf(model.native.config);
  const got = header.geometry;
  for (const k of ["architecture", "numLayers", "numKvHeads", "headDim"] as const) {
    if (got[k] !== want[k]) {
      throw new SnapshotError(
        "fingerprint",
        `snapshot ${k} ${got[k]} differs from the model's ${want[k]}`,
      );
    }
  }
  if (!sameRope(got.rope, want.rope)) {
    throw new SnapshotError(
      "fingerprint",
      `snapshot RoPE ${JSON.stringify(got.rope)} differs from the model's ${
        JSON.stringify(want.rope)
      }`,
    );
  }
  const vocab = model.native.config.vocabSize;
  for (const ids of [header.tokenIds, header.pendingTokenIds]) {
    for (let i = 0; i < ids.length; i++) {
      if (ids[i] >= vocab) {
        throw new SnapshotError(
          "bounds",
          `token id ${ids[i]} at ${i} is outside the vocabulary (${vocab})`,
        );
      }
    }
  }
}

/**
 * Imports a snapshot (bytes or a stream) into a fresh sequence of `model`, chunk by chunk as the
 * bytes arrive, then (by default) prefills the pending tokens. The sequence is allocated only
 * after the header passed its CRC, limits, signature (when verifying) and compatibility checks;
 * it is freed on any later failure.
 * @param model the importing model
 * @param input snapshot bytes or stream
 * @param opts verification keys, size limits, reserve capacity
 * @returns the ready sequence, the token ids, and the last logits
 * @throws SnapshotError (checksum, fingerprint, version, bounds, signature, format, too_large);
 *   RangeError for bad options; EngineError from native calls
 */
export async function importSnapshot(
  model: LoadedModel,
  input: Uint8Array | ReadableStream<Uint8Array>,
  opts: ImportOptions = {},
): Promise<ImportedSnapshot> {
  const reserve = opts.reserve ?? 256;
  const maxTokens = opts.maxTokens ?? MAX_SEQUENCE_TOKENS;
  if (!Number.isInteger(reserve) || reserve < 0) {
    throw new RangeError(`reserve must be a non-negative integer, got ${reserve}`);
  }
  let seq: NativeSequence | null = null;
  try {
    const header = await decodeSnapshot(input, {
      onHeader(h) {
        checkCompatible(model, h);
        if (h.positionOffset !== 0) {
          throw new SnapshotError(
            "format",
            `snapshot starts at position ${h.positionOffset}; importSnapshot needs a snapshot from position 0`,
          );
        }
        const need = h.tokenIds.length + h.pendingTokenIds.length + reserve;
        if (need > maxTokens) {
          throw new SnapshotError(
            "bounds",
            `snapshot needs a ${need}-token sequence (with reserve ${reserve}), above the limit ${maxTokens}`,
          );
        }
        const capacity = Math.max(1, need);
        seq = opts.createSequence
          ? opts.createSequence(capacity)
          : model.native.createSequence(capacity);
        return nativeSink(seq);
      },
    }, {
      verify: opts.verify,
      maxBytes: opts.maxBytes,
      codec: defaultKvCodec(),
    });
    const s = seq as unknown as NativeSequence;
    let logits: Float32Array | null = null;
    if ((opts.prefillPending ?? true) && header.pendingTokenIds.length > 0) {
      logits = await s.prefill(header.pendingTokenIds);
    }
    return {
      sequence: s,
      tokenIds: [...header.tokenIds, ...header.pendingTokenIds],
      logits,
      header,
    };
  } catch (e) {
    (seq as NativeSequence | null)?.free();
    throw e;
  }
}

/** Options of snapshotPrompt. */
export type PromptSnapshotOptions = Omit<ExportOptions, "tokens" | "pending" | "start" | "end">;

/**
 * Snapshots a prompt the way a handoff needs it: prefills all tokens but the last into a fresh
 * sequence, exports that KV, and records the last token as pending, so the importer's own prefill
 * of it yields the next-token logits (the 1-token "repair").
 * @param model the model
 * @param tokens prompt token ids (at least 1)
 * @returns the snapshot bytes
 * @throws RangeError for an empty prompt; as exportSnapshot
 */
export async function snapshotPrompt(
  model: LoadedModel,
  tokens: number[],
  opts: PromptSnapshotOptions = {},
): Promise<Uint8Array> {
  if (tokens.length < 1) throw new RangeError("snapshotPrompt(): the prompt has no tokens");
  const seq = model.native.createSequence(tokens.length);
  try {
    const kvTokens = tokens.slice(0, -1);
    if (kvTokens.length > 0) await seq.prefill(kvTokens);
    return await exportSnapshot(model, seq, {
      ...opts,
      tokens: kvTokens,
      pending: tokens.slice(-1),
    });
  } finally {
    seq.free();
  }
}
