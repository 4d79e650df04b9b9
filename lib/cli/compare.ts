// `compare`: the same prompt and sampling seed through the target with full prefill and with
// migration (source cache → projector → repair → decode), printing both responses and latencies
// as one JSON object. Latencies exclude model loading; the source prefill (a warm source in the
// product flow) is reported separately as source_prefill_ms.

import { decodeLoop, type GenerateResult } from "../engine/mod.ts";
import { applyTemperature, endpointOf, migrateAndRepair } from "../migrate/mod.ts";
import {
  type CliCommand,
  migrationOptions,
  parseModelLoadOptions,
  parseNumber,
  parseOptions,
  parsePairOptions,
  parseSamplingOptions,
  pick,
  printUsage,
  requireString,
  samplingOptions,
  UsageError,
  writeStdout,
} from "./command.ts";
import { loadMigrationPair } from "./model_pair.ts";

const usage = `usage: deno task cli compare --source DIR --target DIR --projector DIR --prompt TEXT
       [--max-tokens N] [--seed S] [--temperature T] [--repair R]

Prints {baseline_response, accelerated_response, baseline_latency_ms, accelerated_latency_ms,
speedup, migrated_tokens, repair_tokens, source_prefill_ms}. Baseline: the target prefills the
whole prompt and generates. Accelerated: the source prefills the prompt (timed apart, as a warm
source), its cache is projected into the target except the last R tokens, which the target
prefills itself (R = the projector's repair_default unless --repair), then the target generates
with the projector's fitted temperature applied to its logits.

  --max-tokens N    tokens to generate (default 64)
  --seed S          sampling seed (default 0)
  --temperature T   sampling temperature, 0 = greedy (default 0.8)
  --threads N  --kv-dtype D  --backend B  --device N`;

async function collect(stream: AsyncGenerator<unknown, GenerateResult>): Promise<GenerateResult> {
  while (true) {
    const s = await stream.next();
    if (s.done) return s.value;
  }
}

/** The `compare` command. */
export const compareCommand: CliCommand = {
  summary: "generate with full prefill and with migration; print both and the speedup",
  usage,
  async run(args) {
    const v = parseOptions(args, {
      ...migrationOptions,
      ...pick(samplingOptions, ["max-tokens", "seed", "temperature"]),
      prompt: { type: "string" },
      repair: { type: "string" },
    });
    if (v.help) return await printUsage(usage);
    const dirs = parsePairOptions(v);
    const prompt = requireString(v.prompt, "prompt");
    const flags = parseSamplingOptions(v);
    const maxTokens = flags.maxTokens ?? 64;
    const seed = flags.seed ?? 0;
    const temperature = flags.temperature ?? 0.8;
    if (maxTokens < 1) throw new UsageError(`--max-tokens must be >= 1, got ${maxTokens}`);
    await using pair = await loadMigrationPair(dirs, parseModelLoadOptions(v));
    const { source, target, projector } = pair;
    const repair = parseNumber(v.repair, "repair", "int") ?? projector?.meta.repair_default ?? 1;
    if (repair < 1) throw new UsageError(`--repair must be >= 1, got ${repair}`);
    const T = projector?.meta.temperature ?? 1;
    const ids = target.tokenizer.encode(prompt, { addSpecialTokens: false });
    const cap = ids.length + maxTokens;
    const sampling = { maxTokens, temperature, seed };
    const ctx = (startMs: number) => ({
      tokenizer: target.tokenizer,
      eosTokenIds: target.eosTokenIds,
      contextIds: ids,
      promptTokens: ids.length,
      startMs,
    });
    // warm-up (thread pools, scratch buffers) so neither side pays first-call costs
    for (const m of [source, target]) {
      using w = m.native.createSequence(Math.min(cap, 16));
      await w.prefill(ids.slice(0, Math.min(ids.length, 16)));
    }
    // baseline: full target prefill
    using base = target.native.createSequence(cap);
    let t0 = performance.now();
    const first = await base.prefill(ids);
    const baseline = await collect(decodeLoop(base, first, ctx(t0), sampling));
    const baselineMs = performance.now() - t0;
    // accelerated: warm source, migrate + repair, temperature-scaled decode
    using src = source.native.createSequence(cap);
    const s0 = performance.now();
    await src.prefill(ids);
    const sourceMs = performance.now() - s0;
    using acc = target.native.createSequence(cap);
    t0 = performance.now();
    const m = await migrateAndRepair({
      source: endpointOf(source),
      sourceSeq: src,
      target: endpointOf(target),
      targetSeq: acc,
      projector,
      prompt: ids,
      repair,
    });
    const scaled = { decode: async (tok: number) => applyTemperature(await acc.decode(tok), T) };
    const accelerated = await collect(
      decodeLoop(scaled, applyTemperature(m.logits, T), ctx(t0), sampling),
    );
    const accMs = performance.now() - t0;
    await writeStdout(
      JSON.stringify({
        baseline_response: baseline.text,
        accelerated_response: accelerated.text,
        baseline_latency_ms: baselineMs,
        accelerated_latency_ms: accMs,
        speedup: baselineMs / accMs,
        migrated_tokens: m.migratedTokens,
        repair_tokens: m.repairTokens,
        source_prefill_ms: sourceMs,
        baseline_ttft_ms: baseline.ttftMs,
        accelerated_ttft_ms: accelerated.ttftMs,
        temperature_applied: T,
      }) + "\n",
    );
    return 0;
  },
};
