// `continue`: restore a `.kvs` snapshot into a model (streamed from the file, verified chunk by
// chunk) and print only the completion. A corrupt or foreign snapshot fails with one line naming
// the failed check (checksum, fingerprint, version, bounds, signature, format, too_large).

import { continueFrom, loadModel } from "../engine/mod.ts";
import { decodeHeader, importSnapshot, LIMITS, type SnapshotHeader } from "../snapshot/mod.ts";
import {
  BACKEND_USAGE,
  type CliCommand,
  keyOptions,
  modelOptions,
  parseModelLoadOptions,
  parseNumber,
  parseOptions,
  parseSamplingOptions,
  pick,
  printUsage,
  readKeyOptions,
  requireString,
  samplingOptions,
  writeStdout,
} from "./command.ts";
import { rethrowSnapshotError } from "./snapshot.ts";

const usage = `usage: deno task cli continue --snapshot FILE --model DIR [options]

Restores the snapshot's KV cache and prints the completion text only (greedy by default, so it
matches \`generate\` for the same prompt and KV type).

  --snapshot FILE      snapshot written by \`snapshot\`
  --model DIR          the checkpoint the snapshot was made with
  --max-tokens N       most tokens to generate (default 256)
  --temperature T      0 = greedy (default 0)
  --top-k K            keep the K most likely tokens (default off)
  --top-p P            nucleus sampling (default 1 = off)
  --seed S             sampling seed (default random)
  --key-id ID          require a signature by this key id (needs --key-file)
  --key-file F         file holding the raw HMAC key
  --max-bytes N        largest snapshot accepted (default 2 GiB)
  --threads N          CPU threads (default all cores)
  --kv-dtype D         KV cache type (default: the type the snapshot was taken from)
${BACKEND_USAGE}`;

// Reads the prefix+header only, to learn the cache dtype before loading the model.
async function peekHeader(file: string, maxBytes: number | undefined): Promise<SnapshotHeader> {
  const f = await Deno.open(file);
  try {
    const pre = new Uint8Array(24);
    let got = 0;
    while (got < 24) {
      const n = await f.read(pre.subarray(got));
      if (n === null) break;
      got += n;
    }
    const hl = new DataView(pre.buffer).getUint32(16, true);
    const len = 24 + Math.min(hl, LIMITS.maxHeaderBytes);
    const buf = new Uint8Array(got === 24 ? len : got);
    buf.set(pre.subarray(0, got));
    while (got < buf.length) {
      const n = await f.read(buf.subarray(got));
      if (n === null) break;
      got += n;
    }
    return decodeHeader(buf.subarray(0, got), { maxBytes }).header;
  } finally {
    f.close();
  }
}

/** The `continue` command. */
export const continueCommand: CliCommand = {
  summary: "restore a KV snapshot and print the completion",
  usage,
  async run(args) {
    const v = parseOptions(args, {
      ...modelOptions,
      ...pick(samplingOptions, ["max-tokens", "temperature", "top-k", "top-p", "seed"]),
      ...keyOptions,
      snapshot: { type: "string" },
      "max-bytes": { type: "string" },
    });
    if (v.help) return await printUsage(usage);
    const file = requireString(v.snapshot, "snapshot");
    const dir = requireString(v.model, "model");
    const sampling = parseSamplingOptions(v);
    const opts = {
      ...sampling,
      maxTokens: sampling.maxTokens ?? 256,
      temperature: sampling.temperature ?? 0,
    };
    const maxBytes = parseNumber(v["max-bytes"], "max-bytes", "int");
    const key = await readKeyOptions(v);
    let header: SnapshotHeader;
    try {
      header = await peekHeader(file, maxBytes);
    } catch (e) {
      rethrowSnapshotError(e, file);
    }
    const native = parseModelLoadOptions(v);
    native.kvDtype ??= header.cacheDtype;
    const model = await loadModel(dir, native);
    try {
      const f = await Deno.open(file);
      let imp;
      try {
        imp = await importSnapshot(model, f.readable, {
          reserve: opts.maxTokens,
          maxBytes,
          verify: key ? { keys: { [key.keyId]: key.key } } : undefined,
        });
      } catch (e) {
        rethrowSnapshotError(e, file);
      }
      try {
        let logits = imp.logits;
        if (logits === null) {
          // a snapshot without pending tokens: recompute the last position's logits
          const last = imp.tokenIds.at(-1);
          if (last === undefined) throw new Error(`snapshot ${file} holds no tokens`);
          imp.sequence.truncate(imp.sequence.length - 1);
          logits = await imp.sequence.prefill([last]);
        }
        const result = await continueFrom(model, imp.sequence, logits, {
          ...opts,
          contextIds: imp.tokenIds,
        });
        await writeStdout(result.text);
      } finally {
        imp.sequence.free();
      }
    } finally {
      model.native.free();
    }
    return 0;
  },
};
