// `generate`: load a model, complete a prompt, stream the completion text (only it) to stdout.
// Greedy by default so scripted runs are reproducible; not a chat session or a server.

import { generateStream, loadModel } from "../engine/mod.ts";
import {
  BACKEND_USAGE,
  type CliCommand,
  modelOptions,
  parseModelLoadOptions,
  parseOptions,
  parseSamplingOptions,
  printUsage,
  requireString,
  samplingOptions,
  UsageError,
  writeStdout,
} from "./command.ts";

const usage = `usage: deno task cli generate --model DIR --prompt TEXT [options]

Prints the completion text only (no trailing newline added) to stdout.

  --model DIR          Hugging Face checkpoint directory (e.g. models/tiny-fast)
  --prompt TEXT        prompt text (encoded without special tokens)
  --chat               wrap the prompt as one user message with the model's chat template
  --max-tokens N       most tokens to generate (default 256)
  --temperature T      0 = greedy (default 0)
  --top-k K            keep the K most likely tokens (default off)
  --top-p P            nucleus sampling, 0 < P <= 1 (default 1 = off)
  --min-p P            drop tokens below P x the top probability (default 0 = off)
  --repetition-penalty R  divide (multiply, when negative) the logits of prompt and output
                       tokens by R > 0 (default 1 = off)
  --seed S             sampling seed (default random)
  --stop TEXT          stop string (repeatable); the text ends before it
  --threads N          CPU threads (default all cores)
  --kv-dtype D         KV cache type f32 | f16 | bf16 (default f32)
${BACKEND_USAGE}`;

/** The `generate` command. */
export const generateCommand: CliCommand = {
  summary: "complete a prompt with a model and print the completion",
  usage,
  async run(args) {
    const v = parseOptions(args, {
      ...modelOptions,
      ...samplingOptions,
      prompt: { type: "string" },
      chat: { type: "boolean" },
    });
    if (v.help) return await printUsage(usage);
    const dir = requireString(v.model, "model");
    if (typeof v.prompt !== "string") throw new UsageError("--prompt is required");
    const sampling = parseSamplingOptions(v);
    const opts = { ...sampling, temperature: sampling.temperature ?? 0 };
    const model = await loadModel(dir, parseModelLoadOptions(v));
    try {
      const prompt = v.chat
        ? model.tokenizer.applyChatTemplate([{ role: "user", content: v.prompt }])
        : v.prompt;
      const stream = generateStream(model, prompt, opts);
      while (true) {
        const step = await stream.next();
        if (step.done) break;
        if (step.value.text.length > 0) await writeStdout(step.value.text);
      }
    } finally {
      model.native.free();
    }
    return 0;
  },
};
