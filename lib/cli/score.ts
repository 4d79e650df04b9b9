// `score`: perplexity of a model on a text file — the file is one token sequence (no special
// tokens) cut into non-overlapping windows; prints {"tokens", "mean_nll", "ppl"}. No generation.

import { DEFAULT_SCORE_CONTEXT, loadModel, scoreTokens } from "../engine/mod.ts";
import {
  BACKEND_USAGE,
  type CliCommand,
  modelOptions,
  parseModelLoadOptions,
  parseNumber,
  parseOptions,
  printUsage,
  requireString,
  UsageError,
  writeStdout,
} from "./command.ts";

const usage = `usage: deno task cli score --model DIR --file TEXT_FILE [--context N] [--json]

Tokenizes the whole file as one sequence (no special tokens), cuts it into consecutive
non-overlapping windows of N tokens (a final window under 2 tokens is dropped); each window
predicts its tokens 1..n-1 from the tokens before them within the window.

  --model DIR      Hugging Face checkpoint directory
  --file PATH      UTF-8 text file
  --context N      window length in tokens, >= 2 (default ${DEFAULT_SCORE_CONTEXT})
  --json           print {"tokens": <predicted positions>, "mean_nll": <nats>, "ppl": <exp(mean_nll)>}
  --threads N      CPU threads (default all cores)
  --kv-dtype D     KV cache type f32 | f16 | bf16 (default f32)
${BACKEND_USAGE}`;

/** The `score` command. */
export const scoreCommand: CliCommand = {
  summary: "perplexity of a model on a text file (windows of N tokens)",
  usage,
  async run(args) {
    const v = parseOptions(args, {
      ...modelOptions,
      file: { type: "string" },
      context: { type: "string" },
      json: { type: "boolean" },
    });
    if (v.help) return await printUsage(usage);
    const dir = requireString(v.model, "model");
    const file = requireString(v.file, "file");
    const context = parseNumber(v.context, "context", "int") ?? DEFAULT_SCORE_CONTEXT;
    if (context < 2) throw new UsageError(`--context must be >= 2, got ${context}`);
    const text = await Deno.readTextFile(file);
    const model = await loadModel(dir, parseModelLoadOptions(v));
    try {
      const ids = model.tokenizer.encode(text);
      const r = await scoreTokens(model, ids, { context });
      if (v.json) {
        await writeStdout(
          JSON.stringify({ tokens: r.tokens, mean_nll: r.meanNll, ppl: r.ppl }) + "\n",
        );
      } else {
        await writeStdout(
          `tokens ${r.tokens}  mean_nll ${r.meanNll.toFixed(4)} nats  ppl ${r.ppl.toFixed(2)}\n`,
        );
      }
    } finally {
      model.native.free();
    }
    return 0;
  },
};
