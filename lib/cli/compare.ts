// `compare`: the same prompt and sampling seed through the target with full prefill and with
// migration (source cache → projector → repair → decode), printing both responses and latencies
// as one JSON object. Latencies exclude model loading; the source prefill (a warm source in the
// product flow) is reported separately as source_prefill_ms.

import { decodeLoop, type GenerateResult, loadModel } from "../engine/mod.ts";
import {
  applyTemperature,
  endpointOf,
  loadProjector,
  migrateAndRepair,
  type Projector,
} from "../migrate/mod.ts";
import {
  type CliCommand,
  nativeOptions,
  parseNumber,
  parseOptions,
  requireString,
  UsageError,
  writeStdout,
} from "./command.ts";

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
  --threads N  --kv-dtype D`;

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
      source: { type: "string" },
      target: { type: "string" },
      projector: { type: "string" },
      prompt: { type: "string" },
      "max-tokens": { type: "string" },
      seed: { type: "string" },
      temperature: { type: "string" },
      repair: { type: "string" },
      threads: { type: "string" },
      "kv-dtype": { type: "string" },
    });
    if (v.help) {
      await writeStdout(usage + "\n");
      return 0;
    }
    const sourceDir = requireString(v.source, "source"),
      targetDir = requireString(v.target, "target");
    if (typeof v.prompt !== "string" || v.prompt.length === 0) {
      throw new UsageError("--prompt is required");
    }
    const maxTokens = parseNumber(v["max-tokens"], "max-tokens", "int") ?? 64;
    const seed = parseNumber(v.seed, "seed", "int") ?? 0;
    const temperature = parseNumber(v.temperature, "temperature", "float") ?? 0.8;
    if (maxTokens < 1) throw new UsageError(`--max-tokens must be >= 1, got ${maxTokens}`);
    const native = nativeOptions(v);
    const source = await loadModel(sourceDir, native);
    const target = await loadModel(targetDir, native);
    let projector: Projector | null = null;
    try {
      if (v.projector !== undefined) {
        projector = await loadProjector(v.projector, endpointOf(source), endpointOf(target));
      } else if (source.fingerprint !== target.fingerprint) {
        throw new UsageError("--projector is required for different models");
      }
      const repair = parseNumber(v.repair, "repair", "int") ?? projector?.meta.repair_default ?? 1;
      if (repair < 1) throw new UsageError(`--repair must be >= 1, got ${repair}`);
      const T = projector?.meta.temperature ?? 1;
      const ids = target.tokenizer.encode(v.prompt, { addSpecialTokens: false });
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
    } finally {
      await projector?.free();
      source.native.free();
      target.native.free();
    }
    return 0;
  },
};
