// `snapshot`: prefill a prompt with a model and save its KV cache as a `.kvs` snapshot file
// (docs/snapshot-format.md), written through a temp file and renamed. Prints nothing on stdout;
// a one-line summary goes to stderr. Not a server handoff (functions/ do that over HTTP).

import { loadModel } from "../engine/mod.ts";
import { type SnapshotEncoding, SnapshotError, snapshotPrompt } from "../snapshot/mod.ts";
import {
  BACKEND_USAGE,
  type CliCommand,
  keyOptions,
  modelOptions,
  parseModelLoadOptions,
  parseNumber,
  parseOptions,
  printUsage,
  readKeyOptions,
  requireString,
  UsageError,
} from "./command.ts";

const usage =
  `usage: deno task cli snapshot --model DIR (--prompt TEXT | --prompt-file F) --out FILE [options]

Prefills the prompt and writes its KV cache to FILE (the last prompt token is stored as a pending
token: \`continue\` prefills it itself to get the next-token logits).

  --model DIR          Hugging Face checkpoint directory (e.g. models/tiny-fast)
  --prompt TEXT        prompt text (encoded without special tokens)
  --prompt-file F      read the prompt text from a file instead
  --out FILE           snapshot file to write
  --encoding E         f32 | f16 | bf16 | q8 | q4 (default: the KV cache's own type, lossless)
  --chunk-tokens N     tokens per chunk (default 256)
  --key-id ID          sign with HMAC-SHA256 under this key id (needs --key-file)
  --key-file F         file holding the raw HMAC key (>= 16 bytes)
  --threads N          CPU threads (default all cores)
  --kv-dtype D         KV cache type f32 | f16 | bf16 (default f32)
${BACKEND_USAGE}`;

const ENCODINGS = ["f32", "f16", "bf16", "q8", "q4"];

/**
 * Rethrows a SnapshotError as a one-line Error naming what failed, e.g.
 * "snapshot rejected (checksum): chunk 2 checksum mismatch: …".
 * @throws always
 */
export function rethrowSnapshotError(e: unknown, file: string): never {
  if (e instanceof SnapshotError) {
    throw new Error(`snapshot ${file} rejected (${e.kind}): ${e.message}`, { cause: e });
  }
  throw e;
}

/** The `snapshot` command. */
export const snapshotCommand: CliCommand = {
  summary: "prefill a prompt and save its KV cache as a snapshot file",
  usage,
  async run(args) {
    const v = parseOptions(args, {
      ...modelOptions,
      ...keyOptions,
      prompt: { type: "string" },
      "prompt-file": { type: "string" },
      out: { type: "string" },
      encoding: { type: "string" },
      "chunk-tokens": { type: "string" },
    });
    if (v.help) return await printUsage(usage);
    const dir = requireString(v.model, "model");
    const out = requireString(v.out, "out");
    if ((v.prompt === undefined) === (v["prompt-file"] === undefined)) {
      throw new UsageError("give exactly one of --prompt and --prompt-file");
    }
    const encoding = v.encoding;
    if (encoding !== undefined && !ENCODINGS.includes(encoding)) {
      throw new UsageError(
        `--encoding must be one of ${ENCODINGS.join(", ")}, got ${JSON.stringify(encoding)}`,
      );
    }
    const chunkTokens = parseNumber(v["chunk-tokens"], "chunk-tokens", "int");
    const sign = await readKeyOptions(v);
    const text = v.prompt ?? await Deno.readTextFile(v["prompt-file"]!);
    const model = await loadModel(dir, parseModelLoadOptions(v));
    try {
      const ids = model.tokenizer.encode(text);
      if (ids.length === 0) throw new UsageError("the prompt encodes to 0 tokens");
      const bytes = await snapshotPrompt(model, ids, {
        encoding: encoding as SnapshotEncoding | undefined,
        chunkTokens,
        sign,
      });
      const tmp = `${out}.tmp-${crypto.randomUUID()}`;
      try {
        await Deno.writeFile(tmp, bytes);
        await Deno.rename(tmp, out);
      } catch (e) {
        await Deno.remove(tmp).catch(() => {});
        throw e;
      }
      console.error(
        `wrote ${out}: ${ids.length} tokens (${
          ids.length - 1
        } with KV + 1 pending), ${bytes.length} bytes, ` +
          `encoding ${encoding ?? model.native.kvDtype}${sign ? `, signed by ${sign.keyId}` : ""}`,
      );
    } finally {
      model.native.free();
    }
    return 0;
  },
};
