// Test-only: draws under a grammar matcher from seeded random logits with the demo tokenizer,
// optionally led by a "teacher" text whose next token is strongly favoured, so a test can ask
// the grammar to let through exactly what it must refuse (invalid arguments, raw control
// characters) and check what came out with an independent validator.

import assert from "node:assert/strict";
import { Tokenizer } from "../tokenizer/mod.ts";
import { NativeSampler } from "../native/mod.ts";
import { DEMO_DIRS } from "../native/test_helpers.ts";
import { Xoshiro128 } from "../engine/prng.ts";
import type { GrammarMatcher } from "./mod.ts";

/** The demo tokenizer's stop token. */
export const EOS = 4093;

let tokenizerP: Promise<Tokenizer> | null = null;
/** The demo tokenizer (tiny-fast's), loaded once per test file. */
export function tokenizer(): Promise<Tokenizer> {
  return tokenizerP ??= Tokenizer.load(DEMO_DIRS[0]);
}

/** Per token id: a bias toward tokens that close strings, numbers and containers (and the stop
 *  token), so draws that leave the teacher still end. */
export async function closingBias(): Promise<Float32Array> {
  const tok = await tokenizer();
  const bias = new Float32Array(tok.vocabSize);
  for (let id = 0; id < tok.vocabSize; id++) {
    if (/["}\],]/.test(tok.decode([id]))) bias[id] = 5;
  }
  bias[EOS] = 5;
  return bias;
}

/**
 * Draws one output under `matcher`: while the output is a prefix of the teacher, the teacher's
 * next token gets +30 (it wins whenever the mask allows it); past the teacher's end the stop
 * token does; elsewhere random logits with the closing bias.
 * @returns the output text (stop excluded)
 */
export async function drawTeacher(
  matcher: GrammarMatcher,
  teacher: string,
  seed: number,
  bias: Float32Array,
  maxSteps = 3000,
): Promise<string> {
  const tok = await tokenizer();
  using sampler = NativeSampler.create({ temperature: 1, topK: 0, topP: 1, minP: 0, seed });
  const rng = new Xoshiro128(seed);
  const out: number[] = [];
  const logits = new Float32Array(bias.length);
  for (let step = 0; step < maxSteps; step++) {
    const mask = await matcher.nextMask();
    sampler.setMask(mask);
    for (let i = 0; i < logits.length; i++) logits[i] = (rng.nextFloat() - 0.5) * 8 + bias[i];
    const text = tok.decode(out);
    if (teacher.startsWith(text)) {
      const rest = teacher.slice(text.length);
      logits[rest === "" ? EOS : tok.encode(rest)[0]] += 30;
    }
    const t = sampler.sample(logits).token;
    assert.ok(
      t < mask.nTokens && ((mask.words[t >>> 5] >>> (t & 31)) & 1) === 1,
      `step ${step}: token ${t} outside the mask`,
    );
    assert.ok(matcher.accept(t), `step ${step}: the grammar rejected token ${t} it allowed`);
    if (matcher.terminated) return tok.decode(out);
    out.push(t);
  }
  throw new Error(`no complete output in ${maxSteps} steps: ${tok.decode(out)}`);
}
