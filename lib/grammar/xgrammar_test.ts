// Tests of structured output (lib/grammar) end to end below HTTP: for each of a dozen schemas
// (nested objects, bounded arrays, enums, numbers, anyOf, required and optional fields) tokens
// are drawn by the native sampler under each step's XGrammar mask — from seeded random logits
// that favour disallowed tokens, and from the tiny-fast model through batched steps with masked
// and unmasked rows — and every decoded output must parse and validate against its schema with
// ajv, an independent JSON Schema validator. Schemas the engine cannot compile are refused with
// the path of the offending construct, before the engine sees them.

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { Tokenizer } from "../tokenizer/mod.ts";
import { NativeModel, NativeSampler } from "../native/mod.ts";
import { checkpoint, DEMO_DIRS, tokens as randomTokens } from "../native/test_helpers.ts";
import { Xoshiro128 } from "../engine/prng.ts";
import { GrammarEngine, GrammarInputError, type GrammarMatcher } from "./mod.ts";
import type { TokenMask } from "../engine/sampling.ts";
import { FLOATS, SCHEMAS } from "./test_schemas.ts";
import { drawTeacher } from "./test_draw.ts";

const DIR = DEMO_DIRS[0];
const EOS = 4093;

let tokenizerP: Promise<Tokenizer> | null = null;
function tokenizer(): Promise<Tokenizer> {
  return tokenizerP ??= Tokenizer.load(DIR);
}

/** Per token id: a bias that makes random logits prefer tokens closing strings, numbers and
 *  containers (and the stop token), so random draws finish in a few hundred steps. */
async function closingBias(): Promise<Float32Array> {
  const tok = await tokenizer();
  const bias = new Float32Array(tok.vocabSize);
  for (let id = 0; id < tok.vocabSize; id++) {
    const s = tok.decode([id]);
    if (/["}\],]/.test(s)) bias[id] = 5;
  }
  bias[EOS] = 5;
  return bias;
}

/** Draws one output under `matcher` from seeded random logits; returns its tokens (stop excluded). */
async function drawRandom(
  matcher: GrammarMatcher,
  sampler: NativeSampler,
  rng: Xoshiro128,
  bias: Float32Array,
  maxSteps = 3000,
): Promise<number[]> {
  const out: number[] = [];
  const logits = new Float32Array(bias.length);
  for (let step = 0; step < maxSteps; step++) {
    const mask = await matcher.nextMask();
    sampler.setMask(mask);
    for (let i = 0; i < logits.length; i++) logits[i] = (rng.nextFloat() - 0.5) * 8 + bias[i];
    const t = sampler.sample(logits).token;
    assert.ok(allowed(mask, t), `step ${step}: token ${t} outside the mask`);
    assert.ok(matcher.accept(t), `step ${step}: the grammar rejected token ${t} it allowed`);
    if (matcher.terminated) return out;
    out.push(t);
  }
  throw new Error(`no complete output in ${maxSteps} steps`);
}

function allowed(mask: TokenMask, t: number): boolean {
  return t < mask.nTokens && ((mask.words[t >>> 5] >>> (t & 31)) & 1) === 1;
}

async function engine(): Promise<GrammarEngine> {
  const tok = await tokenizer();
  return await GrammarEngine.forTokenizer(tok, 4096, [EOS]);
}

Deno.test({
  name:
    "every output drawn under a schema's masks parses and validates with ajv (12 schemas, random logits)",
  // The tokenizer's worker and XGrammar's instance live for the whole file.
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const ajv = new Ajv({ strict: false });
    const eng = await engine();
    const tok = await tokenizer();
    const bias = await closingBias();
    assert.ok(Object.keys(SCHEMAS).length >= 10);
    let outputs = 0;
    for (const [name, schema] of Object.entries({ ...SCHEMAS, floats: FLOATS })) {
      const validate = ajv.compile(schema as object);
      const compiled = await eng.compile({ type: "json_schema", schema });
      for (
        const [k, settings] of [
          { temperature: 1, topK: 0, topP: 1, minP: 0 },
          { temperature: 0.8, topK: 50, topP: 0.95, minP: 0 },
          { temperature: 0, topK: 0, topP: 1, minP: 0 },
        ].entries()
      ) {
        using sampler = NativeSampler.create({ ...settings, seed: 17 + k });
        using matcher = await compiled.matcher();
        const ids = await drawRandom(
          matcher,
          sampler,
          new Xoshiro128(1000 * k + name.length),
          bias,
        );
        const text = tok.decode(ids);
        let value: unknown;
        try {
          value = JSON.parse(text);
        } catch (e) {
          throw new Error(`${name}: not JSON: ${text} (${(e as Error).message})`);
        }
        assert.ok(validate(value), `${name}: ${text} fails: ${JSON.stringify(validate.errors)}`);
        // Compact: no newline or indentation between members (a line break can only stand
        // escaped inside a string).
        assert.ok(!text.includes("\n"), `${name}: not compact: ${JSON.stringify(text)}`);
        outputs++;
      }
    }
    assert.equal(outputs, (Object.keys(SCHEMAS).length + 1) * 3);
  },
});

Deno.test({
  name: "json_object gives a JSON object; the compiled-grammar cache keys on the canonical schema",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const eng = await engine();
    const tok = await tokenizer();
    const bias = await closingBias();
    const compiled = await eng.compile({ type: "json_object" });
    using sampler = NativeSampler.create({ temperature: 1, topK: 0, topP: 1, minP: 0, seed: 5 });
    using matcher = await compiled.matcher();
    const text = tok.decode(await drawRandom(matcher, sampler, new Xoshiro128(3), bias));
    const value = JSON.parse(text);
    assert.ok(value !== null && typeof value === "object" && !Array.isArray(value), text);
    // Any properties (not strict): an object with members is let through as written.
    const teacher = '{"key":"x"}';
    using led = await compiled.matcher();
    assert.equal(await drawTeacher(led, teacher, 1, bias), teacher);
    const before = eng.cached;
    await eng.compile({ type: "json_schema", schema: { required: ["a"], type: "object" } });
    await eng.compile({ type: "json_schema", schema: { type: "object", required: ["a"] } });
    assert.equal(eng.cached, before + 1);
  },
});

Deno.test({
  name:
    "schemas the engine cannot compile are refused naming their path, and the engine keeps working",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const eng = await engine();
    const P = "response_format.json_schema.schema";
    const cases: [unknown, string][] = [
      [{ type: "foo" }, `${P}.type`],
      [{ type: "object", properties: { a: { type: ["string", 3] } } }, `${P}.properties.a.type[1]`],
      [
        { type: "object", properties: { a: { $ref: "#/$defs/missing" } } },
        `${P}.properties.a.$ref`,
      ],
      [
        { type: "object", properties: { a: { $ref: "http://x/y.json" } } },
        `${P}.properties.a.$ref`,
      ],
      [
        { type: "object", properties: { b: { type: "string", pattern: "(?<=x)y" } } },
        `${P}.properties.b.pattern`,
      ],
      [{ type: "string", pattern: "([" }, `${P}.pattern`],
      [{ anyOf: [{ type: "integer" }, { not: { type: "string" } }] }, `${P}.anyOf[1].not`],
      [{ type: "array", items: { type: "integer" }, minItems: 3, maxItems: 1 }, `${P}.minItems`],
      [{ type: "number", maximum: 1 }, `${P}.maximum`],
      [{ type: "integer", minimum: 0, maximum: 180 }, `${P}.maximum`],
      [{ type: "object", properties: { r: { enum: [1, 0.5] } } }, `${P}.properties.r.enum`],
      [{ type: "integer", exclusiveMinimum: 0 }, `${P}.exclusiveMinimum`],
      [{ type: "array", items: [{ type: 7 }] }, `${P}.items`],
      [{ type: "object", properties: { "a b": { enum: [] } } }, `${P}.properties["a b"].enum`],
      [42, P],
    ];
    for (const [schema, path] of cases) {
      await assert.rejects(
        eng.compile({ type: "json_schema", schema }),
        (e) => e instanceof GrammarInputError && e.param === path && e.message.startsWith(path),
        `${JSON.stringify(schema)} → ${path}`,
      );
    }
    // Still usable after the refusals (none reached the engine).
    const compiled = await eng.compile({ type: "json_schema", schema: SCHEMAS.person });
    using m = await compiled.matcher();
    assert.ok((await m.nextMask()).words.some((w) => w !== 0));
  },
});

Deno.test({
  name:
    "the tiny-fast model decodes under masks in batched steps: masked rows validate, unmasked rows draw freely",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    using model = NativeModel.load(await checkpoint(DIR), { threads: 2 });
    const vocab = model.config.vocabSize;
    const ajv = new Ajv({ strict: false });
    const eng = await engine();
    const tok = await tokenizer();
    const names = ["person", "enums", "const_and_bool", "any_of", "bounded_array", "nested"];
    const n = names.length + 2; // two unconstrained rows ride along
    const pool = model.createKvPool(4096, 16);
    const seqs = Array.from({ length: n }, () => pool.createSequence(512));
    const samplers = seqs.map((_, i) =>
      model.createSampler({ temperature: 0.7, topK: 0, topP: 1, minP: 0, seed: 90 + i })
    );
    const matchers: (GrammarMatcher | null)[] = [];
    try {
      for (let i = 0; i < n; i++) {
        matchers.push(
          i < names.length
            ? await (await eng.compile({ type: "json_schema", schema: SCHEMAS[names[i]] }))
              .matcher()
            : null,
        );
      }
      const next: number[] = [];
      for (let i = 0; i < n; i++) {
        const prompt = randomTokens(5, vocab, 200 + i);
        await model.batchStep([{ seq: seqs[i], tokens: prompt.slice(0, -1), wantLogits: false }]);
        next.push(prompt[prompt.length - 1]);
      }
      const out: number[][] = seqs.map(() => []);
      const done = new Array<boolean>(n).fill(false);
      for (let step = 0; step < 480 && done.some((d, i) => !d && matchers[i]); step++) {
        const live = seqs.map((_, i) => i).filter((i) => !done[i]);
        // Each masked row's next mask, right after its previous token was accepted.
        for (const i of live) {
          samplers[i].setMask(matchers[i] ? await matchers[i]!.nextMask() : null);
        }
        const res = await model.batchStep(live.map((i) => ({
          seq: seqs[i],
          tokens: [next[i]],
          wantLogits: false,
          sample: { sampler: samplers[i] },
        })));
        live.forEach((i, k) => {
          const t = res[k] as number;
          assert.equal(typeof t, "number", String(res[k]));
          const m = matchers[i];
          if (m) {
            assert.ok(m.accept(t), `row ${i} step ${step}: token ${t} rejected`);
            if (m.terminated) done[i] = true;
            else out[i].push(t);
          } else {
            out[i].push(t);
            if (out[i].length >= 40) done[i] = true;
          }
          next[i] = t;
        });
      }
      for (let i = 0; i < names.length; i++) {
        assert.ok(done[i], `${names[i]}: no complete output`);
        const text = tok.decode(out[i]);
        const validate = ajv.compile(SCHEMAS[names[i]] as object);
        assert.ok(validate(JSON.parse(text)), `${names[i]}: ${text}`);
      }
      assert.ok(out[names.length].length > 0);
    } finally {
      for (const m of matchers) m?.dispose();
      for (const s of samplers) s.free();
      for (const s of seqs) s.free();
      pool.free();
      tok.close();
    }
  },
});
