// Tests of GrammarDraws: a greedy generation under a JSON schema, which draws first where the
// grammar allows most tokens, gives the tokens of the mask-first loop (the oracle: every draw
// masked before it is taken) while computing fewer masks; a greedy row whose tokens the grammar
// accepts needs no mask at all, one whose tokens it rejects goes back to masks; sampled without
// filters it still only produces outputs the grammar accepts; allowsMost against a plain bit
// count.

import assert from "node:assert/strict";
import { type LoadedModel, loadModel } from "./load.ts";
import { generate, type TokenGrammar } from "./generate.ts";
import { allowsMost, GrammarDraws } from "./grammar_draw.ts";
import { NativeSampler } from "../native/mod.ts";
import { type CompiledFormat, GrammarEngine, type GrammarMatcher } from "../grammar/mod.ts";
import { Xoshiro128 } from "./prng.ts";
import { Tokenizer } from "../tokenizer/mod.ts";

const root = new URL("../../", import.meta.url).pathname;
const EOS = 4093;

/** Bounded strings (their masks are the expensive ones), an enum, a number and an array. */
const SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 24 },
    kind: { enum: ["bird", "ship", "lamp"] },
    count: { type: "integer", minimum: 0, maximum: 99 },
    notes: { type: "array", items: { type: "string", maxLength: 12 }, minItems: 1, maxItems: 2 },
  },
  required: ["name", "kind", "count", "notes"],
  additionalProperties: false,
};

/** A matcher that counts the masks asked of it and the tokens it rejected (draws taken first
 *  and wasted). */
function counting(m: GrammarMatcher): TokenGrammar & { masks: number; rejected: number } {
  const g = {
    masks: 0,
    rejected: 0,
    nextMask() {
      g.masks++;
      return m.nextMask();
    },
    accept(t: number) {
      const ok = m.accept(t);
      if (!ok) g.rejected++;
      return ok;
    },
    get terminated() {
      return m.terminated;
    },
    dispose: () => m.dispose(),
  };
  return g;
}

/** Runs `f` with tiny-fast and SCHEMA compiled for its tokenizer. */
async function withSchema(
  f: (model: LoadedModel, compiled: CompiledFormat) => Promise<void>,
): Promise<void> {
  const model = await loadModel(`${root}models/tiny-fast`, { threads: 2 });
  try {
    const engine = await GrammarEngine.forTokenizer(
      model.tokenizer,
      model.native.config.vocabSize,
      [EOS],
    );
    await f(model, await engine.compile({ type: "json_schema", schema: SCHEMA }));
  } finally {
    model.native.free();
    model.tokenizer.close();
  }
}

Deno.test("greedy under a JSON schema: drawing first gives the mask-first tokens with fewer masks", async () => {
  await withSchema(async (model, compiled) => {
    const tok = model.tokenizer;
    for (const prompt of ["The keeper wrote down the ship", "A list of lamps:", "Once"]) {
      const ids = tok.encode(prompt);
      const grammar = counting(await compiled.matcher());
      const got = await generate(model, ids, { temperature: 0, maxTokens: 160, grammar });

      // The oracle: every draw masked first, on the same model's logits.
      const oracle = await compiled.matcher();
      using sampler = NativeSampler.create({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 });
      const seq = model.native.createSequence(ids.length + 161);
      const want: number[] = [];
      try {
        let logits = await seq.prefill(ids);
        while (want.length < 160) {
          sampler.setMask(await oracle.nextMask());
          const t = sampler.sample(logits, tok.vocabSize).token;
          assert.ok(oracle.accept(t));
          want.push(t);
          if (oracle.terminated) break;
          logits = await seq.decode(t);
        }
      } finally {
        seq.free();
        oracle.dispose();
      }
      assert.deepEqual(got.tokenIds, want, `prompt ${JSON.stringify(prompt)}`);
      assert.equal(got.finishReason, "stop", "the schema's object completes");
      JSON.parse(got.text);
      assert.ok(
        grammar.masks < got.tokenIds.length,
        `${grammar.masks} masks for ${got.tokenIds.length} tokens: nothing was drawn first`,
      );
    }
  });
});

Deno.test("sampled without filters under a JSON schema, every output parses and has the schema's keys", async () => {
  await withSchema(async (model, compiled) => {
    for (const seed of [1, 2, 3, 4]) {
      const out = await generate(model, "Notes:", {
        temperature: 0.9,
        topP: 1,
        seed,
        maxTokens: 200,
        grammar: await compiled.matcher(),
      });
      assert.equal(out.finishReason, "stop", out.text);
      const v = JSON.parse(out.text);
      assert.deepEqual(Object.keys(v), ["name", "kind", "count", "notes"]);
      assert.ok(v.name.length <= 24 && ["bird", "ship", "lamp"].includes(v.kind), out.text);
    }
  });
});

Deno.test("a greedy row that follows the grammar needs no mask; one that does not goes back to masks", async () => {
  const tok = await Tokenizer.load(`${root}models/tiny-fast`);
  try {
    const engine = await GrammarEngine.forTokenizer(tok, tok.vocabSize, [EOS]);
    const compiled = await engine.compile({ type: "json_schema", schema: SCHEMA });
    const teacher = '{"name":"Ada of the lamp","kind":"ship","count":42,"notes":["calm","late"]}';
    const want = tok.encode(teacher);
    const rng = new Xoshiro128(3);
    /** Greedy draws through GrammarDraws; logits favour the teacher's next token by `lead`. */
    const run = async (lead: number) => {
      const grammar = counting(await compiled.matcher());
      using sampler = NativeSampler.create({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 });
      const draws = new GrammarDraws(grammar, sampler, true, true);
      const out: number[] = [];
      const logits = new Float32Array(tok.vocabSize);
      try {
        while (out.length < 400) {
          await draws.beforeDraw();
          for (let i = 0; i < logits.length; i++) logits[i] = rng.nextFloat() * 4;
          logits[out.length < want.length ? want[out.length] : EOS] += lead;
          logits[EOS] += 2; // so a row off the teacher still ends
          const t = (await draws.take(sampler.sample(logits))).token;
          if (grammar.terminated) break;
          out.push(t);
        }
        return {
          text: tok.decode(out),
          tokens: out.length,
          masks: grammar.masks,
          rejected: grammar.rejected,
        };
      } finally {
        grammar.dispose();
      }
    };
    const follows = await run(30);
    assert.equal(follows.text, teacher);
    assert.equal(follows.masks, 0, `${follows.masks} masks for a row the grammar accepts`);
    const strays = await run(0);
    JSON.parse(strays.text);
    // Off the grammar, narrow states are masked first again: few draws are taken first and
    // wasted (the probes, and wide states the row leaves).
    assert.ok(
      strays.rejected <= strays.tokens / 4 && strays.masks >= strays.tokens / 2,
      `${strays.rejected} wasted draws, ${strays.masks} masks for ${strays.tokens} tokens`,
    );
  } finally {
    tok.close();
  }
});

Deno.test("`allowsMost()` is whether a plain bit count reaches half the tokens", () => {
  const rng = new Xoshiro128(8);
  for (let k = 0; k < 200; k++) {
    const n = 1 + Math.floor(rng.nextFloat() * 5000);
    const density = rng.nextFloat();
    const words = new Uint32Array(Math.ceil(n / 32));
    let count = 0;
    for (let t = 0; t < n; t++) {
      if (rng.nextFloat() < density) {
        words[t >>> 5] |= 1 << (t & 31);
        count++;
      }
    }
    assert.equal(allowsMost({ words, nTokens: n }), count * 2 >= n, `n ${n} count ${count}`);
  }
});
