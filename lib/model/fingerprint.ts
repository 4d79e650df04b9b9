// Model fingerprint: hex SHA-256 (Web Crypto) identifying "the same computation" — the config
// fields that shape the forward pass plus, per tensor (sorted by name), its name, dtype, shape,
// byte count and a digest of its bytes. File layout (sharding, header order, padding) and
// non-computational fields (eos/bos ids, max_position_embeddings, architecture alias) are
// excluded, so a resharded copy has the same fingerprint.
//
// Tensor digests:
//   mode "sample" (default, cheap): SHA-256 of the tensor's first, middle and last 4 KiB
//     (the whole tensor when it is at most 12 KiB). Catches a different model or a rewritten
//     file, but not a change to a byte outside the sampled windows.
//   mode "full": SHA-256 over the concatenated SHA-256 digests of consecutive 16 MiB chunks of
//     the tensor (Web Crypto has no streaming hash); every byte counts.
// The canonical document hashed is JSON with sorted keys:
//   {"config": {...}, "mode": "sample"|"full", "tensors": [{digest, dtype, name, nbytes, shape}], "v": 1}

import { canonicalJson, hex, sha256 } from "../util/mod.ts";
import type { ModelConfig } from "./config.ts";
import type { TensorInfo } from "./safetensors.ts";

/** Window size of the sampled digest (bytes). */
export const SAMPLE_WINDOW = 4096;
const FULL_CHUNK = 16 * 1024 * 1024;

/** The one canonical JSON (lib/util), re-exported for this module's callers. */
export { canonicalJson };

/**
 * The config fields that change what the forward pass computes.
 * @param config the model config
 * @returns a plain object of those fields
 */
export function computationalConfig(config: ModelConfig): Record<string, unknown> {
  return {
    family: config.family,
    vocabSize: config.vocabSize,
    hiddenSize: config.hiddenSize,
    intermediateSize: config.intermediateSize,
    numLayers: config.numLayers,
    numHeads: config.numHeads,
    numKvHeads: config.numKvHeads,
    headDim: config.headDim,
    rmsNormEps: config.rmsNormEps,
    ropeTheta: config.ropeTheta,
    ropeScaling: config.ropeScaling,
    tieWordEmbeddings: config.tieWordEmbeddings,
    attentionBias: config.attentionBias,
    mlpBias: config.mlpBias,
  };
}

class FileReader {
  #files = new Map<string, Deno.FsFile>();

  async read(path: string, offset: number, length: number): Promise<Uint8Array<ArrayBuffer>> {
    let f = this.#files.get(path);
    if (!f) {
      f = await Deno.open(path, { read: true });
      this.#files.set(path, f);
    }
    await f.seek(offset, Deno.SeekMode.Start);
    const buf = new Uint8Array(length);
    let got = 0;
    while (got < length) {
      const n = await f.read(buf.subarray(got));
      if (n === null) throw new Error(`${path}: short read at offset ${offset + got}`);
      got += n;
    }
    return buf;
  }

  /** Same as read(), synchronously: the 4 KiB sample windows come from the page cache in
   *  microseconds, where two awaited ops per window cost a scheduler turn each (startup). */
  readSync(path: string, offset: number, length: number): Uint8Array<ArrayBuffer> {
    let f = this.#files.get(path);
    if (!f) {
      f = Deno.openSync(path, { read: true });
      this.#files.set(path, f);
    }
    f.seekSync(offset, Deno.SeekMode.Start);
    const buf = new Uint8Array(length);
    let got = 0;
    while (got < length) {
      const n = f.readSync(buf.subarray(got));
      if (n === null) throw new Error(`${path}: short read at offset ${offset + got}`);
      got += n;
    }
    return buf;
  }

  close(): void {
    for (const f of this.#files.values()) f.close();
    this.#files.clear();
  }
}

const row = (t: TensorInfo) => ({ name: t.name, dtype: t.dtype, shape: t.shape, nbytes: t.nbytes });

async function tensorDigest(r: FileReader, t: TensorInfo, full: boolean): Promise<string> {
  if (full) {
    const parts: Uint8Array[] = [];
    for (let pos = 0; pos < t.nbytes || (pos === 0 && t.nbytes === 0); pos += FULL_CHUNK) {
      const len = Math.min(FULL_CHUNK, t.nbytes - pos);
      parts.push(new Uint8Array(await sha256(await r.read(t.file, t.offset + pos, len))));
      if (t.nbytes === 0) break;
    }
    const cat = new Uint8Array(parts.length * 32);
    parts.forEach((p, i) => cat.set(p, i * 32));
    return hex(await sha256(cat));
  }
  return hex(await sha256(sampleBytes(r, t)));
}

/** The sampled windows of a tensor, concatenated (read synchronously, see readSync). */
function sampleBytes(r: FileReader, t: TensorInfo): Uint8Array<ArrayBuffer> {
  if (t.nbytes <= 3 * SAMPLE_WINDOW) return r.readSync(t.file, t.offset, t.nbytes);
  const mid = Math.floor((t.nbytes - SAMPLE_WINDOW) / 2);
  const cat = new Uint8Array(3 * SAMPLE_WINDOW);
  cat.set(r.readSync(t.file, t.offset, SAMPLE_WINDOW), 0);
  cat.set(r.readSync(t.file, t.offset + mid, SAMPLE_WINDOW), SAMPLE_WINDOW);
  cat.set(
    r.readSync(t.file, t.offset + t.nbytes - SAMPLE_WINDOW, SAMPLE_WINDOW),
    2 * SAMPLE_WINDOW,
  );
  return cat;
}

/**
 * Computes a model fingerprint (see the file comment for exactly what is hashed).
 * @param config the model config
 * @param tensors every tensor of the checkpoint
 * @param opts fullHash: hash every tensor byte instead of 4 KiB samples
 * @returns lowercase hex SHA-256 (64 characters)
 * @throws Error when a tensor's bytes cannot be read
 */
export async function computeFingerprint(
  config: ModelConfig,
  tensors: Iterable<TensorInfo>,
  opts: { fullHash?: boolean } = {},
): Promise<string> {
  const full = opts.fullHash === true;
  const sorted = [...tensors].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const reader = new FileReader();
  const rows = [];
  try {
    if (full) {
      for (const t of sorted) {
        rows.push({ ...row(t), digest: await tensorDigest(reader, t, true) });
      }
    } else {
      // Samples are read in order; their digests run concurrently (one scheduler turn in all).
      const samples = sorted.map((t) => sampleBytes(reader, t));
      const digests = await Promise.all(samples.map(async (b) => hex(await sha256(b))));
      sorted.forEach((t, i) => rows.push({ ...row(t), digest: digests[i] }));
    }
  } finally {
    reader.close();
  }
  const doc = {
    v: 1,
    mode: full ? "full" : "sample",
    config: computationalConfig(config),
    tensors: rows,
  };
  return hex(await sha256(new TextEncoder().encode(canonicalJson(doc))));
}
