// Snapshot benchmark: per demo model and encoding — bytes per token and per KV element,
// export (encode) and import (decode) throughput, and the continuation cross-entropy change an
// encoding causes on valid.txt windows versus the never-exported cache. Imports the code it
// measures (lib/snapshot); medians over repeated runs. Run by bench/main.ts.

import { type LoadedModel, loadModel } from "../lib/engine/mod.ts";
import {
  decodeHeader,
  exportSnapshot,
  importSnapshot,
  type SnapshotEncoding,
} from "../lib/snapshot/mod.ts";
import { median } from "./machine.ts";

const root = new URL("../", import.meta.url).pathname;
const MODELS = ["tiny-fast", "tiny-balanced", "tiny-powerful"];
const ENCODINGS: SnapshotEncoding[] = ["f32", "bf16", "f16", "q8", "q4"];
const THROUGHPUT_TOKENS = 1024;
const RUNS = 5;
const WINDOWS = 8; // valid.txt windows for the cross-entropy change
const WINDOW = 256; // tokens per window (the demo models' trained context)
const PREFIX = 192; // tokens whose KV crosses the snapshot; the rest are scored

/** One (model, cache dtype, encoding) row. */
export interface SnapshotBenchRow {
  model: string;
  cacheDtype: "f32" | "bf16";
  encoding: SnapshotEncoding;
  /** Whole snapshot bytes / KV tokens, for THROUGHPUT_TOKENS tokens. */
  bytesPerToken: number;
  /** Chunk payload bytes / KV elements (layers × 2 × kv_heads × head_dim × tokens). */
  bytesPerElement: number;
  /** Snapshot bytes produced per second by exportSnapshot (KV read + encode + CRC), MB/s. */
  encodeMBps: number;
  /** Snapshot bytes consumed per second by importSnapshot (verify + decode + KV write), MB/s. */
  decodeMBps: number;
  /** KV cache bytes (in the cache's dtype) exported per second, MB/s. */
  encodeCacheMBps: number;
  /** KV cache bytes (in the cache's dtype) restored per second, MB/s. */
  decodeCacheMBps: number;
  /** Mean continuation NLL (nats/token) with the imported cache minus without export. */
  deltaCrossEntropy: number;
  /** Fraction of scored positions whose argmax equals the unexported cache's. */
  top1Agreement: number;
}

function nll(logits: Float32Array, vocab: number, row: number, target: number): number {
  let max = -Infinity;
  for (let i = 0; i < vocab; i++) max = Math.max(max, logits[row * vocab + i]);
  let sum = 0;
  for (let i = 0; i < vocab; i++) sum += Math.exp(logits[row * vocab + i] - max);
  return Math.log(sum) + max - logits[row * vocab + target];
}

function argmaxRow(logits: Float32Array, vocab: number, row: number): number {
  let best = 0;
  for (let i = 1; i < vocab; i++) {
    if (logits[row * vocab + i] > logits[row * vocab + best]) best = i;
  }
  return best;
}

async function windows(model: LoadedModel): Promise<number[][]> {
  const text = await Deno.readTextFile(`${root}../shared/corpus/valid.txt`);
  const out: number[][] = [];
  const step = Math.floor(text.length / (WINDOWS + 1));
  for (let w = 0; w < WINDOWS; w++) {
    const ids = model.tokenizer.encode(text.slice(w * step, w * step + 6 * WINDOW));
    out.push(ids.slice(0, WINDOW));
  }
  return out;
}

// Logits for positions PREFIX-1 .. WINDOW-2 (scoring tokens PREFIX .. WINDOW-1), with the first
// PREFIX-1 tokens' KV either computed here or imported from a snapshot in `encoding`.
async function continuationLogits(
  model: LoadedModel,
  ids: number[],
  encoding: SnapshotEncoding | null,
): Promise<Float32Array> {
  const src = model.native.createSequence(WINDOW);
  try {
    await src.prefill(ids.slice(0, PREFIX - 1));
    if (encoding === null) {
      return await src.prefill(ids.slice(PREFIX - 1, WINDOW - 1), { allPositions: true });
    }
    const bytes = await exportSnapshot(model, src, { tokens: ids.slice(0, PREFIX - 1), encoding });
    const imp = await importSnapshot(model, bytes, { reserve: WINDOW, prefillPending: false });
    try {
      return await imp.sequence.prefill(ids.slice(PREFIX - 1, WINDOW - 1), { allPositions: true });
    } finally {
      imp.sequence.free();
    }
  } finally {
    src.free();
  }
}

async function benchModel(name: string, cacheDtype: "f32" | "bf16"): Promise<SnapshotBenchRow[]> {
  const model = await loadModel(`${root}models/${name}`, { kvDtype: cacheDtype, threads: 1 });
  const rows: SnapshotBenchRow[] = [];
  try {
    const cfg = model.native.config;
    const vocab = cfg.vocabSize;
    const wins = await windows(model);
    const base = await Promise.all(wins.map((w) => continuationLogits(model, w, null)));
    // a long deterministic sequence for sizes and throughput
    const ids = wins.flat().slice(0, THROUGHPUT_TOKENS);
    while (ids.length < THROUGHPUT_TOKENS) ids.push(ids[ids.length % 100]);
    const seq = model.native.createSequence(THROUGHPUT_TOKENS);
    await seq.prefill(ids);
    const encodings = cacheDtype === "f32" ? ENCODINGS : ["bf16" as const, "q8" as const];
    for (const encoding of encodings) {
      const enc: number[] = [], dec: number[] = [];
      let bytes: Uint8Array = new Uint8Array(0);
      for (let r = 0; r < RUNS; r++) {
        let t0 = performance.now();
        bytes = await exportSnapshot(model, seq, { tokens: ids, encoding });
        enc.push((performance.now() - t0) / 1000);
        t0 = performance.now();
        const imp = await importSnapshot(model, bytes, { reserve: 0 });
        dec.push((performance.now() - t0) / 1000);
        imp.sequence.free();
      }
      const elements = THROUGHPUT_TOKENS * cfg.numLayers * 2 * cfg.numKvHeads * cfg.headDim;
      const nChunks = Math.ceil(THROUGHPUT_TOKENS / 256);
      const cacheBytes = elements * (cacheDtype === "f32" ? 4 : 2);
      const payload = chunkPayloadBytes(bytes) - nChunks * 12;
      let dce = 0, agree = 0, n = 0;
      for (let w = 0; w < wins.length; w++) {
        const got = await continuationLogits(model, wins[w], encoding);
        for (let row = 0; row < WINDOW - PREFIX; row++) {
          const target = wins[w][PREFIX + row];
          dce += nll(got, vocab, row, target) - nll(base[w], vocab, row, target);
          if (argmaxRow(got, vocab, row) === argmaxRow(base[w], vocab, row)) agree++;
          n++;
        }
      }
      rows.push({
        model: name,
        cacheDtype,
        encoding,
        bytesPerToken: bytes.length / THROUGHPUT_TOKENS,
        bytesPerElement: payload / elements,
        encodeMBps: bytes.length / median(enc) / 1e6,
        decodeMBps: bytes.length / median(dec) / 1e6,
        encodeCacheMBps: cacheBytes / median(enc) / 1e6,
        decodeCacheMBps: cacheBytes / median(dec) / 1e6,
        deltaCrossEntropy: dce / n,
        top1Agreement: agree / n,
      });
    }
    seq.free();
  } finally {
    model.native.free();
  }
  return rows;
}

// Sum of chunk frame lengths, read from the snapshot's own header.
function chunkPayloadBytes(bytes: Uint8Array): number {
  const { header } = decodeHeader(bytes);
  return header.chunks.reduce((s, c) => s + c.length, 0);
}

/**
 * Runs the snapshot benchmark on the three demo models (f32 caches: every encoding; bf16 caches:
 * bf16 and q8).
 * @returns `{ config, rows }` (JSON-ready)
 */
export async function benchSnapshots(): Promise<object> {
  const rows: SnapshotBenchRow[] = [];
  for (const m of MODELS) {
    rows.push(...await benchModel(m, "f32"));
    rows.push(...await benchModel(m, "bf16"));
  }
  return {
    config: {
      throughputTokens: THROUGHPUT_TOKENS,
      runs: RUNS,
      chunkTokens: 256,
      q4GroupSize: 32,
      crossEntropy: {
        windows: WINDOWS,
        windowTokens: WINDOW,
        prefixTokens: PREFIX,
        corpus: "valid.txt",
      },
      threads: 1,
    },
    rows,
  };
}

/**
 * Formats benchSnapshots() rows as a Markdown table.
 * @returns the table text
 */
export function formatSnapshotTable(result: object): string {
  const rows = (result as { rows: SnapshotBenchRow[] }).rows;
  const lines = [
    "| model | cache | encoding | bytes/token | bytes/element | encode MB/s (cache MB/s) | decode MB/s (cache MB/s) | ΔCE (nats) | top-1 agree |",
    "|---|---|---|---|---|---|---|---|---|",
  ];
  for (const r of rows) {
    lines.push(
      `| ${r.model} | ${r.cacheDtype} | ${r.encoding} | ${r.bytesPerToken.toFixed(1)} | ${
        r.bytesPerElement.toFixed(3)
      } | ${r.encodeMBps.toFixed(0)} (${r.encodeCacheMBps.toFixed(0)}) | ${
        r.decodeMBps.toFixed(0)
      } (${r.decodeCacheMBps.toFixed(0)}) | ${r.deltaCrossEntropy.toFixed(5)} | ${
        (100 * r.top1Agreement).toFixed(1)
      }% |`,
    );
  }
  return lines.join("\n");
}

if (import.meta.main) {
  const r = await benchSnapshots();
  console.log(formatSnapshotTable(r));
  console.log(JSON.stringify(r));
}
