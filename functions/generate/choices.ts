// Several choices of one prompt (OpenAI's `n`, and `best_of` on completions): the prompt is
// prefilled once and the other choices fork its KV (Generation.fork), each with its own sampler
// seed (seed + i when the request gives one, so every choice is reproducible on its own), all
// decoding together in the tier's batched steps. Limits, the per-choice options, collecting
// them all, best_of's pick, and interleaving streamed choices. Routes live in app.ts.
import type { GenerateChunk, GenerateOptions } from "../../lib/engine/mod.ts";
import { type Generation, InputError, type ServedResult } from "../../lib/serve/mod.ts";
import type { StructuredOutput } from "./structured.ts";

/** Most choices (`n`) and candidates (`best_of`) one request may ask for. */
export const MAX_CHOICES = 16;

/**
 * Checks `n` and `best_of` (OpenAI's rules: best_of ≥ n, no streaming with best_of > 1).
 * @param n choices to return (default 1)
 * @param bestOf candidates to generate (completions only; default n)
 * @param stream whether the response streams
 * @returns the choices returned and the candidates generated
 * @throws {InputError} naming `n` or `best_of`
 */
export function choiceCounts(
  n: number | null | undefined,
  bestOf: number | null | undefined,
  stream: boolean,
): { n: number; candidates: number } {
  const count = n ?? 1;
  if (count > MAX_CHOICES) {
    throw new InputError(`n must be at most ${MAX_CHOICES}, got ${count}`, "n");
  }
  const candidates = bestOf ?? count;
  if (candidates > MAX_CHOICES) {
    throw new InputError(`best_of must be at most ${MAX_CHOICES}, got ${candidates}`, "best_of");
  }
  if (candidates < count) {
    throw new InputError(`best_of (${candidates}) must be at least n (${count})`, "best_of");
  }
  if (stream && bestOf != null && bestOf > 1) {
    throw new InputError("best_of > 1 cannot be streamed", "best_of");
  }
  return { n: count, candidates };
}

/**
 * Options of choice `i` (≥ 1) given choice 0's: the seed advanced by i when one was given.
 * @param options choice 0's options
 * @param i the choice
 * @returns its options
 */
export function choiceOptions(
  options: Omit<GenerateOptions, "signal">,
  i: number,
): Omit<GenerateOptions, "signal"> {
  const { grammar: _, ...rest } = options;
  return options.seed === undefined ? rest : { ...rest, seed: options.seed + i };
}

/**
 * Forks `count - 1` more generations from a prefilled one, each with its own options (and its
 * own grammar matcher under response_format). Closes `gen` when forking fails.
 * @param gen choice 0, prefilled, not yet decoding
 * @param count choices in all (≥ 1)
 * @param structured response_format, when set
 * @param param the request field `count` came from (`n` or `best_of`)
 * @returns the `count` generations, choice 0 first
 * @throws {QueueFullError} when the pool lacks the blocks now; whatever fork throws
 */
export async function forkChoices(
  gen: Generation,
  count: number,
  structured?: StructuredOutput,
  param = "n",
): Promise<Generation[]> {
  if (count === 1) return [gen];
  const options: Omit<GenerateOptions, "signal">[] = [];
  try {
    for (let i = 1; i < count; i++) {
      const o = choiceOptions(gen.options, i);
      options.push(structured ? { ...o, grammar: await structured.matcher() } : o);
    }
    return [gen, ...gen.fork(options, param)];
  } catch (e) {
    for (const o of options) o.grammar?.dispose();
    gen.close();
    throw e;
  }
}

/**
 * Runs every generation to its end, together (their decodes share the scheduler's steps).
 * @param gens the generations
 * @returns their results, in order
 * @throws the first failure, after closing the others
 */
export async function collectAll(gens: Generation[]): Promise<ServedResult[]> {
  try {
    return await Promise.all(gens.map((g) => g.collect()));
  } finally {
    for (const g of gens) g.close();
  }
}

/** Cumulative logprob of a result (every step's chosen token). */
export function cumulativeLogprob(r: ServedResult): number {
  let s = 0;
  for (const l of r.logprobs ?? []) s += l.logprob;
  return s;
}

/**
 * best_of's pick: the `n` candidates with the highest cumulative logprob, best first (as vLLM
 * orders them); ties keep the earlier candidate.
 * @param results the candidates (generated with logprobs)
 * @param n how many to keep
 * @returns indices into `results`
 */
export function bestOf(results: ServedResult[], n: number): number[] {
  const score = results.map(cumulativeLogprob);
  return results.map((_, i) => i).sort((a, b) => score[b] - score[a] || a - b).slice(0, n);
}

/** One step of one choice, or its end. */
export type ChoiceEvent =
  | { choice: number; chunk: GenerateChunk; done?: undefined }
  | { choice: number; done: true; result: ServedResult };

/**
 * Decodes every generation at once and yields their chunks as they come, interleaved (each
 * choice's own order kept); each choice ends with its result. Closes them all on exit.
 * @param gens the generations
 * @yields chunks and ends, tagged with the choice
 */
export async function* interleave(gens: Generation[]): AsyncGenerator<ChoiceEvent> {
  const its = gens.map((g) => g.tokens());
  const next = (i: number) => its[i].next().then((s) => ({ i, s }));
  const pending = new Map(its.map((_, i) => [i, next(i)]));
  try {
    while (pending.size > 0) {
      const { i, s } = await Promise.race(pending.values());
      if (s.done) {
        pending.delete(i);
        yield { choice: i, done: true, result: s.value };
      } else {
        pending.set(i, next(i));
        yield { choice: i, chunk: s.value };
      }
    }
  } finally {
    for (const g of gens) g.close();
    // Settle what is in flight so no rejection goes unobserved once the sequences are freed.
    await Promise.allSettled(pending.values());
  }
}
