// Tests of the generation loop (decodeLoop) with a scripted fake sequence whose logits are one-hot
// on the next scripted token, and the real demo tokenizer. The oracle is the script itself: the
// expected text is the script's decode cut by hand at the stop.

import { assert, assertEquals, assertRejects } from "../tokenizer/_assert.ts";
import { Tokenizer } from "../tokenizer/mod.ts";
import {
  decodeLoop,
  type GenerateChunk,
  type GenerateOptions,
  type GenerateResult,
} from "./generate.ts";

const root = new URL("../../", import.meta.url).pathname;
const tok = await Tokenizer.load(`${root}models/tiny-fast`);
const EOS = 4093;
const VOCAB = 4096;

function oneHot(id: number): Float32Array {
  const l = new Float32Array(VOCAB).fill(-10);
  l[id] = 10;
  return l;
}

/** A sequence that answers each decode with logits pointing at the next token of the script. */
class ScriptedSequence {
  fed: number[] = [];
  #i = 1;
  constructor(readonly script: number[]) {}
  first(): Float32Array {
    return oneHot(this.script[0]);
  }
  decode(token: number): Promise<Float32Array> {
    this.fed.push(token);
    const next = this.script[this.#i++] ?? 0;
    return Promise.resolve(oneHot(next));
  }
}

async function runScript(script: number[], opts: GenerateOptions = {}) {
  const seq = new ScriptedSequence(script);
  const gen = decodeLoop(seq, seq.first(), {
    tokenizer: tok,
    eosTokenIds: [EOS],
    contextIds: [],
    promptTokens: 7,
    startMs: performance.now(),
  }, { temperature: 0, ...opts });
  const chunks: GenerateChunk[] = [];
  let result: GenerateResult;
  while (true) {
    const step = await gen.next();
    if (step.done) {
      result = step.value;
      break;
    }
    chunks.push(step.value);
  }
  return { chunks, result, fed: seq.fed };
}

const BODY = tok.encode("Hello world. The end is near, 日本");
const SCRIPT = [...BODY, EOS, ...tok.encode(" after eos")];

Deno.test("`decodeLoop()` stops at the eos token, keeping it in tokenIds and out of the text", async () => {
  const { chunks, result, fed } = await runScript(SCRIPT);
  assertEquals(result.finishReason, "stop");
  assertEquals(result.tokenIds, [...BODY, EOS]);
  assertEquals(result.text, "Hello world. The end is near, 日本");
  assertEquals(result.promptTokens, 7);
  assert(result.ttftMs >= 0);
  // One chunk per token; the chunks add up to the text; the last token is never fed back.
  assertEquals(chunks.map((c) => c.tokenId), result.tokenIds);
  assertEquals(chunks.map((c) => c.text).join(""), result.text);
  assertEquals(fed, BODY);
  for (const c of chunks) assert(!c.text.includes("\uFFFD"));
});

Deno.test("`decodeLoop()` ends the text before a stop string and stops decoding when it completes", async () => {
  const { result, chunks, fed } = await runScript(SCRIPT, { stop: [" The end"] });
  assertEquals(result.finishReason, "stop");
  assertEquals(result.text, "Hello world.");
  // tokenIds end with the token that completed the stop string: decode(tokenIds) contains it.
  const decoded = tok.decode(result.tokenIds);
  assert(
    decoded.includes(" The end") && !tok.decode(result.tokenIds.slice(0, -1)).includes(" The end"),
  );
  assertEquals(chunks.map((c) => c.text).join(""), "Hello world.");
  assertEquals(fed.length, result.tokenIds.length - 1);
});

Deno.test("`decodeLoop()` holds back a possible stop string while streaming and releases it when it fails", async () => {
  const { result, chunks } = await runScript(SCRIPT, { stop: [" The endless"] });
  assertEquals(result.finishReason, "stop"); // eos
  assertEquals(result.text, "Hello world. The end is near, 日本");
  // After the token that completes " The end", nothing from " The" has been streamed yet.
  let streamed = "";
  let checked = 0;
  for (const c of chunks) {
    streamed += c.text;
    const decodedSoFar = tok.decode(result.tokenIds.slice(0, chunks.indexOf(c) + 1));
    if (decodedSoFar.endsWith(" The") || decodedSoFar.endsWith(" The end")) {
      assertEquals(streamed, "Hello world.");
      checked++;
    }
  }
  assertEquals(checked, 2, 'the script should end tokens at " The" and " The end"');
  assertEquals(streamed, result.text);
});

Deno.test("`decodeLoop()` stops with finishReason length after maxTokens", async () => {
  const { result, fed } = await runScript(SCRIPT, { maxTokens: 3 });
  assertEquals(result.finishReason, "length");
  assertEquals(result.tokenIds, BODY.slice(0, 3));
  assertEquals(result.text, tok.decode(BODY.slice(0, 3)));
  assertEquals(fed, BODY.slice(0, 2));
});

Deno.test("`decodeLoop()` decodes past eos when stopTokenIds is empty and stops on a custom id", async () => {
  const { result } = await runScript(SCRIPT, { stopTokenIds: [], maxTokens: SCRIPT.length });
  assertEquals(result.finishReason, "length");
  assertEquals(result.text, "Hello world. The end is near, 日本 after eos");
  const custom = await runScript(SCRIPT, { stopTokenIds: [BODY[2]] });
  assertEquals(custom.result.tokenIds, BODY.slice(0, 3));
  assertEquals(custom.result.text, tok.decode(BODY.slice(0, 2)));
});

Deno.test("`decodeLoop()` minTokens bans the stop tokens until that many tokens were generated", async () => {
  // The script's EOS comes at index BODY.length. Banned there, the one-hot row's best other token
  // is a tie of every other id at -10: greedy takes the lowest, 0. Then the script goes on.
  const n = BODY.length;
  const banned = await runScript(SCRIPT, { minTokens: n + 1, maxTokens: SCRIPT.length });
  assertEquals(banned.result.tokenIds.slice(0, n + 1), [...BODY, 0]);
  assertEquals(banned.result.tokenIds.includes(EOS), false);
  assertEquals(banned.result.finishReason, "length");
  // minTokens = n: n tokens are out when EOS comes, so it stops as without minTokens.
  const allowed = await runScript(SCRIPT, { minTokens: n });
  assertEquals(allowed.result.tokenIds, [...BODY, EOS]);
  assertEquals(allowed.result.finishReason, "stop");
  // Custom stop ids are banned too; after minTokens the next one stops (and is not in the text).
  const custom = await runScript([...BODY, BODY[1]], { stopTokenIds: [BODY[1]], minTokens: 3 });
  assertEquals(custom.result.tokenIds.slice(0, 2), [BODY[0], 0]);
  assertEquals(custom.result.tokenIds.at(-1), BODY[1]);
  assertEquals(custom.result.finishReason, "stop");
  await assertRejects(
    () => runScript(SCRIPT, { minTokens: 5, maxTokens: 4 }),
    RangeError,
    "minTokens",
  );
});

Deno.test("`decodeLoop()` returns finishReason abort when the signal fires between tokens", async () => {
  const ac = new AbortController();
  const seq = new ScriptedSequence(SCRIPT);
  const gen = decodeLoop(seq, seq.first(), {
    tokenizer: tok,
    eosTokenIds: [EOS],
    contextIds: [],
    promptTokens: 1,
    startMs: performance.now(),
  }, { temperature: 0, signal: ac.signal });
  await gen.next();
  await gen.next();
  ac.abort();
  const end = await gen.next();
  assert(end.done);
  assertEquals(end.value.finishReason, "abort");
  assertEquals(end.value.tokenIds, BODY.slice(0, 2));
});

Deno.test("`decodeLoop()` rejects bad options with RangeError/TypeError before sampling", async () => {
  await assertRejects(() => runScript(SCRIPT, { maxTokens: 0 }), RangeError, "maxTokens");
  await assertRejects(() => runScript(SCRIPT, { stop: [""] }), TypeError, "stop[0]");
  await assertRejects(() => runScript(SCRIPT, { topP: 2 }), RangeError, "topP");
  await assertRejects(
    () => runScript(SCRIPT, { stopTokenIds: [-1] }),
    TypeError,
    "stopTokenIds[0]",
  );
});

// ---- With the native engine and the tiny-fast demo model. Oracle: fresh-sequence prefills and
// argmax, computed here without the generation loop.

import { loadModel } from "./load.ts";
import { continueFrom, generate, generateStream, MAX_SEQUENCE_TOKENS } from "./generate.ts";
import { argmax } from "../../tests/reference/sampler.ts";
import { stepLogprobs } from "../../tests/reference/logits.ts";
import { referenceGenerate } from "../../tests/reference/generate.ts";
import type { NativeSequence } from "../native/mod.ts";

const PROMPT = "The Congress of the United States";
let modelCache: Awaited<ReturnType<typeof loadModel>> | undefined;
async function model() {
  modelCache ??= await loadModel(`${root}models/tiny-fast`, { threads: 2 });
  return modelCache;
}
// The model stays loaded for the whole file; Deno's sanitizers do not track native memory.

/** Records the sequences the loop creates, to check they are freed. */
function spySequences(
  m: Awaited<ReturnType<typeof loadModel>>,
): { created: NativeSequence[]; restore(): void } {
  const created: NativeSequence[] = [];
  const native = m.native;
  const original = native.createSequence;
  native.createSequence = function (capacity: number) {
    const s = original.call(native, capacity);
    created.push(s);
    return s;
  };
  return { created, restore: () => void (native.createSequence = original) };
}
function isFreed(seq: NativeSequence): boolean {
  try {
    void seq.length;
    return false;
  } catch (e) {
    return (e as Error).message.includes("freed");
  }
}

Deno.test("`loadModel()` loads tiny-fast with its tokenizer, eos ids and fingerprints", async () => {
  const m = await model();
  assertEquals(m.name, "tiny-fast");
  assertEquals(m.eosTokenIds, [EOS]);
  assertEquals(m.native.config.vocabSize, 4096);
  assertEquals(m.tokenizer.fingerprint, tok.fingerprint);
  assert(/^[0-9a-f]{64}$/.test(m.fingerprint));
});

Deno.test("`generate()` greedy equals argmax of a fresh prefill at every step and is deterministic", async () => {
  const m = await model();
  const spy = spySequences(m);
  try {
    const r = await generate(m, PROMPT, { temperature: 0, maxTokens: 12, stopTokenIds: [] });
    assertEquals(r.finishReason, "length");
    assertEquals(r.tokenIds.length, 12);
    assertEquals(r.promptTokens, tok.encode(PROMPT).length);
    assertEquals(r.text, tok.decode(r.tokenIds));
    const again = await generate(m, PROMPT, { temperature: 0, maxTokens: 12, stopTokenIds: [] });
    assertEquals(again.tokenIds, r.tokenIds);
    // Oracle: token i is argmax of prefill(prompt + tokens[0..i−1]) on a fresh sequence.
    const prompt = tok.encode(PROMPT);
    for (let i = 0; i < r.tokenIds.length; i++) {
      const seq = m.native.createSequence(64);
      try {
        assertEquals(
          argmax(await seq.prefill([...prompt, ...r.tokenIds.slice(0, i)])),
          r.tokenIds[i],
          `token ${i}`,
        );
      } finally {
        seq.free();
      }
    }
    assertEquals(spy.created.filter((s) => !isFreed(s)).length, 0, "every sequence freed");
  } finally {
    spy.restore();
  }
});

Deno.test("`generate()` ends before a stop string picked from the greedy output", async () => {
  const m = await model();
  const full = await generate(m, PROMPT, { temperature: 0, maxTokens: 40, stopTokenIds: [] });
  // A stop string that starts mid-output: 4 characters beginning at the 3rd token's text.
  const at = tok.decode(full.tokenIds.slice(0, 3)).length;
  const stop = full.text.slice(at, at + 4);
  assertEquals(stop.length, 4);
  const cut = full.text.indexOf(stop);
  const r = await generate(m, PROMPT, {
    temperature: 0,
    maxTokens: 40,
    stopTokenIds: [],
    stop: [stop],
  });
  assertEquals(r.finishReason, "stop");
  assertEquals(r.text, full.text.slice(0, cut));
  // Same tokens as the unstopped run, up to the one that completed the stop string.
  assertEquals(r.tokenIds, full.tokenIds.slice(0, r.tokenIds.length));
  assert(
    tok.decode(r.tokenIds).includes(stop) && !tok.decode(r.tokenIds.slice(0, -1)).includes(stop),
  );
});

Deno.test("`generateStream()` chunks add up to generate()'s text for one seed; another seed differs", async () => {
  const m = await model();
  const opts = { temperature: 1, topP: 0.95, seed: 7, maxTokens: 30, stopTokenIds: [] };
  const whole = await generate(m, PROMPT, opts);
  const stream = generateStream(m, PROMPT, opts);
  let text = "";
  const ids: number[] = [];
  while (true) {
    const step = await stream.next();
    if (step.done) {
      assertEquals(step.value.text, whole.text);
      break;
    }
    text += step.value.text;
    ids.push(step.value.tokenId);
  }
  assertEquals(text, whole.text);
  assertEquals(ids, whole.tokenIds);
  const other = await generate(m, PROMPT, { ...opts, seed: 8 });
  assert(other.tokenIds.join() !== whole.tokenIds.join(), "seeds 7 and 8 gave the same 30 tokens");
});

Deno.test("`generateStream()` frees its sequence when aborted or closed early", async () => {
  const m = await model();
  const spy = spySequences(m);
  try {
    const ac = new AbortController();
    const stream = generateStream(m, PROMPT, {
      temperature: 0,
      maxTokens: 50,
      signal: ac.signal,
      stopTokenIds: [],
    });
    await stream.next();
    await stream.next();
    ac.abort();
    const end = await stream.next();
    assert(end.done);
    assertEquals(end.value.finishReason, "abort");
    assertEquals(end.value.tokenIds.length, 2);
    // Closing a stream early (break in for-await) also frees it.
    for await (const _chunk of generateStream(m, PROMPT, { temperature: 0, maxTokens: 50 })) break;
    assertEquals(spy.created.length, 2);
    assert(spy.created.every(isFreed), "sequences freed");
    const pre = new AbortController();
    pre.abort();
    const r = await generate(m, PROMPT, { signal: pre.signal });
    assertEquals([r.finishReason, r.tokenIds.length], ["abort", 0]);
  } finally {
    spy.restore();
  }
});

Deno.test("`generate()` takes token ids as the prompt and rejects empty or oversized prompts", async () => {
  const m = await model();
  const byText = await generate(m, PROMPT, { temperature: 0, maxTokens: 5 });
  const byIds = await generate(m, tok.encode(PROMPT), { temperature: 0, maxTokens: 5 });
  assertEquals(byIds.tokenIds, byText.tokenIds);
  await assertRejects(() => generate(m, ""), RangeError, "empty");
  await assertRejects(() => generate(m, [1, 4096]), RangeError, "prompt[1] = 4096");
  await assertRejects(
    () => generate(m, [1], { maxTokens: MAX_SEQUENCE_TOKENS }),
    RangeError,
    "exceeds",
  );
});

Deno.test("`continueFrom()` continues a prefilled sequence like generate() and leaves it open", async () => {
  const m = await model();
  const prompt = tok.encode(PROMPT);
  const ref = await generate(m, prompt, { temperature: 0, maxTokens: 10, stopTokenIds: [] });
  const seq = m.native.createSequence(prompt.length + 10);
  try {
    const logits = await seq.prefill(prompt);
    const r = await continueFrom(m, seq, logits, {
      temperature: 0,
      maxTokens: 10,
      stopTokenIds: [],
      contextIds: prompt,
    });
    assertEquals(r.tokenIds, ref.tokenIds);
    assertEquals(r.text, ref.text);
    assertEquals(r.promptTokens, prompt.length);
    assertEquals(seq.length, prompt.length + 9); // the last sampled token is not fed
    await assertRejects(
      () => continueFrom(m, seq, logits, { maxTokens: 5 }),
      RangeError,
      "no room",
    );
    await assertRejects(() => continueFrom(m, seq, new Float32Array(3)), RangeError, "lastLogits");
  } finally {
    seq.free();
  }
});

Deno.test("`generate()` gives the same tokens when two generations run concurrently", async () => {
  const m = await model();
  const opts = { temperature: 0.9, seed: 11, maxTokens: 16, stopTokenIds: [] };
  const alone = [await generate(m, PROMPT, opts), await generate(m, "Moby Dick", opts)];
  const together = await Promise.all([generate(m, PROMPT, opts), generate(m, "Moby Dick", opts)]);
  assertEquals(together.map((r) => r.tokenIds), alone.map((r) => r.tokenIds));
});

Deno.test("`generate()` samples natively with the same tokens as the reference sampler, many settings", async () => {
  const m = await model();
  const settings = [
    { temperature: 0 },
    { temperature: 1 },
    { temperature: 0.8, topK: 20 },
    { temperature: 1.1, topP: 0.9 },
    { temperature: 0.9, minP: 0.05 },
    { temperature: 0.7, topK: 50, topP: 0.95, minP: 0.02 },
  ];
  for (const s of settings) {
    for (const seed of [1, 99, 123456789]) {
      const opts = { ...s, seed, maxTokens: 24, stopTokenIds: [] };
      const native = await generate(m, PROMPT, opts);
      const ref = await referenceGenerate(m, PROMPT, opts);
      assertEquals(native.tokenIds, ref.map((r) => r.tokenId), JSON.stringify(opts));
      assertEquals(native.text, tok.decode(native.tokenIds));
    }
  }
});

Deno.test("`generate()` with a repetition penalty: greedy equals the penalised argmax of a fresh prefill at every step", async () => {
  const m = await model();
  const p = 1.3;
  const r = await generate(m, PROMPT, {
    temperature: 0,
    repetitionPenalty: p,
    maxTokens: 24,
    stopTokenIds: [],
  });
  const off = await generate(m, PROMPT, { temperature: 0, maxTokens: 24, stopTokenIds: [] });
  assert(r.text !== off.text, "the penalty changes this greedy continuation");
  // Oracle: the rule written out on the raw logits of prefill(prompt + tokens[0..i−1]).
  const prompt = tok.encode(PROMPT);
  for (let i = 0; i < r.tokenIds.length; i++) {
    const seq = m.native.createSequence(64);
    try {
      const ctx = [...prompt, ...r.tokenIds.slice(0, i)];
      const row = (await seq.prefill(ctx)).slice(0, tok.vocabSize);
      for (const id of new Set(ctx)) row[id] = Math.fround(row[id] > 0 ? row[id] / p : row[id] * p);
      assertEquals(argmax(row), r.tokenIds[i], `token ${i}`);
    } finally {
      seq.free();
    }
  }
});

Deno.test("`generate()` with penalties, logit_bias and min_tokens samples natively with the reference's tokens and logprobs", async () => {
  const m = await model();
  const common = tok.encode(PROMPT);
  const settings: GenerateOptions[] = [
    { temperature: 0, repetitionPenalty: 1.5 },
    { temperature: 0.8, topP: 0.95, repetitionPenalty: 1.2 },
    { temperature: 1, topK: 40, repetitionPenalty: 0.8 },
    { temperature: 0.9, repetitionPenalty: 1.3, presencePenalty: 0.5 },
    { temperature: 1, frequencyPenalty: 0.7 },
    { temperature: 0.8, topK: 30, presencePenalty: -0.4, frequencyPenalty: 1.1 },
    { temperature: 1, logitBias: new Map([[common[0], 3.25], [common[1], -2.5], [7, 1e-3]]) },
    { temperature: 0, logitBias: new Map([[common[2], 0.75]]), frequencyPenalty: 0.3, logprobs: 3 },
    // min_tokens: EOS is likely (bias), banned for the first 5 draws, drawn as soon as allowed
    { temperature: 1.2, logitBias: new Map([[EOS, 6]]), minTokens: 5 },
    {
      temperature: 0.7,
      topP: 0.9,
      minP: 0.02,
      repetitionPenalty: 1.1,
      presencePenalty: 0.2,
      frequencyPenalty: 0.2,
      logitBias: new Map([[EOS, 4]]),
      minTokens: 3,
      logprobs: 5,
    },
  ];
  for (const s of settings) {
    for (const seed of [5, 77]) {
      const opts = { ...s, seed, maxTokens: 24, stopTokenIds: s.minTokens ? [EOS] : [] };
      const chunks: GenerateChunk[] = [];
      const it = generateStream(m, PROMPT, opts);
      for (let st = await it.next(); !st.done; st = await it.next()) chunks.push(st.value);
      const ref = await referenceGenerate(m, PROMPT, opts);
      const what = JSON.stringify({ ...opts, logitBias: [...(opts.logitBias ?? [])] });
      assertEquals(chunks.map((c) => c.tokenId), ref.map((r) => r.tokenId), what);
      if (s.logprobs !== undefined) {
        assertEquals(chunks.map((c) => c.logprobs), ref.map((r) => r.logprobs), what);
      }
      if (s.minTokens) assert(!chunks.slice(0, s.minTokens).some((c) => c.tokenId === EOS), what);
    }
  }
});

Deno.test("`generate()` minTokens keeps a forced EOS out until then, on the real model", async () => {
  const m = await model();
  // logit_bias +100 on EOS makes it the certain pick whenever it is allowed.
  const force = { logitBias: new Map([[EOS, 100]]), temperature: 0 };
  assertEquals((await generate(m, PROMPT, force)).tokenIds, [EOS]);
  const r = await generate(m, PROMPT, { ...force, minTokens: 3 });
  assertEquals(r.tokenIds.length, 4);
  assertEquals(r.tokenIds.indexOf(EOS), 3);
  assertEquals(r.finishReason, "stop");
  assertEquals(r.text, tok.decode(r.tokenIds.slice(0, 3)));
});

Deno.test("`decodeLoop()` samples the logits a target returns when it has no sampling decode step", async () => {
  // A target that scales logits in JavaScript (as `compare` does) must not be bypassed.
  const m = await model();
  const seq = m.native.createSequence(64);
  try {
    const first = await seq.prefill(tok.encode(PROMPT));
    let steps = 0;
    const target = {
      decode: async (t: number) => {
        steps++;
        return (await seq.decode(t)).map((x) => x * 0.5);
      },
    };
    const loop = decodeLoop(target, first.map((x) => x * 0.5), {
      tokenizer: tok,
      eosTokenIds: [EOS],
      contextIds: [],
      promptTokens: 7,
      startMs: performance.now(),
    }, { temperature: 0, maxTokens: 5, stopTokenIds: [] });
    while (!(await loop.next()).done);
    assertEquals(steps, 4);
  } finally {
    seq.free();
  }
});

Deno.test("`generate()` with logprobs takes them from the native sampler, equal to the reference bit for bit", async () => {
  const m = await model();
  const settings = [
    { temperature: 0, logprobs: 5 },
    { temperature: 1, logprobs: 0 },
    { temperature: 0.8, topK: 20, logprobs: 20 },
    { temperature: 1.1, topP: 0.9, minP: 0.02, logprobs: 3 },
  ];
  for (const s of settings) {
    for (const seed of [1, 123456789]) {
      const opts = { ...s, seed, maxTokens: 16, stopTokenIds: [] };
      const native: GenerateChunk[] = [];
      const it = generateStream(m, PROMPT, opts);
      for (let st = await it.next(); !st.done; st = await it.next()) native.push(st.value);
      const ref = await referenceGenerate(m, PROMPT, opts);
      assertEquals(native.length, 16);
      assertEquals(
        native.map((c) => ({ tokenId: c.tokenId, logprobs: c.logprobs })),
        ref,
        JSON.stringify(opts),
      );
      for (const c of native) assertEquals(c.logprobs!.top.length, s.logprobs);
    }
  }
});

Deno.test("`decodeLoop()` asks the target's native decode step for logprobs; a target without one gets them from a native sampler on its rows", async () => {
  const m = await model();
  const ids = tok.encode(PROMPT);
  for (const withNative of [true, false]) {
    const seq = m.native.createSequence(64);
    const ref = m.native.createSequence(64);
    try {
      const first = await seq.prefill(ids);
      let refLogits = await ref.prefill(ids);
      const requests: unknown[] = [];
      const target = withNative
        ? {
          decode: (t: number) => seq.decode(t),
          createSampler: (o: Parameters<NativeSequence["createSampler"]>[0]) =>
            seq.createSampler(o),
          decodeSample: (...a: Parameters<NativeSequence["decodeSample"]>) => {
            requests.push(a[3]);
            return seq.decodeSample(...a);
          },
        }
        : { decode: (t: number) => seq.decode(t) };
      const loop = decodeLoop(target, first, {
        tokenizer: tok,
        eosTokenIds: [EOS],
        contextIds: [],
        promptTokens: ids.length,
        startMs: performance.now(),
      }, { temperature: 0.9, seed: 5, maxTokens: 6, stopTokenIds: [], logprobs: 4 });
      for (let s = await loop.next(); !s.done; s = await loop.next()) {
        // Oracle: the TypeScript log-softmax of the same row (a second, identical sequence).
        const width = Math.min(refLogits.length, tok.vocabSize);
        assertEquals(
          s.value.logprobs,
          stepLogprobs(refLogits.subarray(0, width), s.value.tokenId, 4),
        );
        refLogits = await ref.decode(s.value.tokenId);
      }
      assertEquals(requests, withNative ? Array(5).fill({ logprob: true, topLogprobs: 4 }) : []);
    } finally {
      seq.free();
      ref.free();
    }
  }
});
