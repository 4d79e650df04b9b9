// n > 1 and best_of through the official `openai` client: every forked choice against the
// one-choice path (a single request with seed + i), logprobs per choice, usage, best_of's pick
// against the candidates' logprob sums, streamed choices reassembled, bad values refused, and the
// prompt prefilled once (the scheduler's prefill token counter).
import assert from "node:assert/strict";
import OpenAI from "openai";
import { testRuntime } from "../shared/test_helpers.ts";
import { client } from "./openai_client.ts";

const prompt = "The old lighthouse stood at the edge of the";
const messages = [{ role: "user" as const, content: prompt }];
const sampled = { model: "fast", temperature: 1, max_tokens: 12 } as const;

/** The HTTP status and error param of a client call (200 when it succeeds). */
function status(
  p: Promise<unknown>,
): Promise<{ status: number | undefined; param?: string | null }> {
  return p.then(
    () => ({ status: 200, param: undefined }),
    (e: InstanceType<typeof OpenAI.APIError>) => ({
      status: e.status,
      param: (e.error as { param?: string } | undefined)?.param,
    }),
  );
}

function sum(xs: number[]): number {
  return xs.reduce((a, b) => a + b, 0);
}

Deno.test("completions n=4 with a seed: choice i equals a single request with seed+i, logprobs too", async () => {
  const rt = await testRuntime();
  try {
    const ai = client(rt);
    const seed = 1234;
    const r = await ai.completions.create({ ...sampled, prompt, n: 4, seed, logprobs: 2 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
    let completion = 0;
    let promptTokens = 0;
    for (let i = 0; i < 4; i++) {
      const one = await ai.completions.create({ ...sampled, prompt, seed: seed + i, logprobs: 2 });
      assert.equal(r.choices[i].text, one.choices[0].text, `choice ${i}`);
      assert.equal(r.choices[i].finish_reason, one.choices[0].finish_reason);
      assert.deepEqual(r.choices[i].logprobs, one.choices[0].logprobs, `choice ${i} logprobs`);
      completion += one.usage!.completion_tokens;
      promptTokens = one.usage!.prompt_tokens;
    }
    // Sampled at temperature 1 with different seeds: the choices are not all one text.
    assert.ok(new Set(r.choices.map((c) => c.text)).size > 1);
    assert.deepEqual(r.usage, {
      prompt_tokens: promptTokens,
      completion_tokens: completion,
      total_tokens: promptTokens + completion,
    });
  } finally {
    await rt.close();
  }
});

Deno.test("chat n=3 with a seed equals single requests; greedy n=2 gives identical choices", async () => {
  const rt = await testRuntime();
  try {
    const ai = client(rt);
    const r = await ai.chat.completions.create({
      ...sampled,
      messages,
      n: 3,
      seed: 77,
      logprobs: true,
      top_logprobs: 2,
    });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    const singles = [];
    for (let i = 0; i < 3; i++) {
      singles.push(
        await ai.chat.completions.create({
          ...sampled,
          messages,
          seed: 77 + i,
          logprobs: true,
          top_logprobs: 2,
        }),
      );
      assert.equal(r.choices[i].message.content, singles[i].choices[0].message.content);
      assert.deepEqual(r.choices[i].logprobs, singles[i].choices[0].logprobs);
    }
    assert.equal(r.usage!.prompt_tokens, singles[0].usage!.prompt_tokens);
    assert.equal(r.usage!.completion_tokens, sum(singles.map((s) => s.usage!.completion_tokens)));

    const g = await ai.chat.completions.create({ ...sampled, messages, n: 2, temperature: 0 });
    const one = await ai.chat.completions.create({ ...sampled, messages, temperature: 0 });
    assert.equal(g.choices.length, 2);
    assert.equal(g.choices[0].message.content, one.choices[0].message.content);
    assert.equal(g.choices[1].message.content, one.choices[0].message.content);
  } finally {
    await rt.close();
  }
});

Deno.test("best_of returns the n candidates with the highest logprob sums; usage counts all", async () => {
  const rt = await testRuntime();
  try {
    const ai = client(rt);
    const seed = 99;
    // The candidates: best_of=4 generates exactly what n=4 does with the same seed.
    const all = await ai.completions.create({ ...sampled, prompt, n: 4, seed, logprobs: 0 });
    const sums = all.choices.map((c) => sum(c.logprobs!.token_logprobs!));
    const order = [0, 1, 2, 3].sort((a, b) => sums[b] - sums[a] || a - b);
    // Logprobs not asked for: the pick still ranks by them, the choices carry none.
    const r = await ai.completions.create({ ...sampled, prompt, n: 2, best_of: 4, seed });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
    assert.deepEqual(
      r.choices.map((c) => c.text),
      order.slice(0, 2).map((i) => all.choices[i].text),
    );
    assert.ok(r.choices.every((c) => c.logprobs === null));
    assert.deepEqual(r.usage, all.usage);
    // With logprobs: the kept candidates' own.
    const w = await ai.completions.create({ ...sampled, prompt, best_of: 4, seed, logprobs: 0 });
    assert.equal(w.choices.length, 1);
    assert.deepEqual(w.choices[0].logprobs, all.choices[order[0]].logprobs);
  } finally {
    await rt.close();
  }
});

async function streamedTexts(
  stream: AsyncIterable<
    { choices: { index: number; text?: string; delta?: { content?: string | null } }[] }
  >,
): Promise<{ texts: string[]; indices: number[] }> {
  const texts: string[] = [];
  const indices: number[] = [];
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      texts[c.index] = (texts[c.index] ?? "") + (c.text ?? c.delta?.content ?? "");
      indices.push(c.index);
    }
  }
  return { texts, indices };
}

Deno.test("streamed n=2 interleaves choices and reassembles to the non-streamed texts", async () => {
  const rt = await testRuntime();
  try {
    const ai = client(rt);
    const seed = 5;
    const plain = await ai.completions.create({ ...sampled, prompt, n: 2, seed });
    const s = await streamedTexts(
      await ai.completions.create({
        ...sampled,
        prompt,
        n: 2,
        seed,
        stream: true,
        stream_options: { include_usage: true },
      }),
    );
    assert.deepEqual(s.texts, plain.choices.map((c) => c.text));
    // Decoded together: choice 1's chunks do not all wait for choice 0's end.
    assert.ok(s.indices.lastIndexOf(0) > s.indices.indexOf(1), s.indices.join(","));

    const chat = await ai.chat.completions.create({ ...sampled, messages, n: 2, seed });
    const cs = await streamedTexts(
      await ai.chat.completions.create({ ...sampled, messages, n: 2, seed, stream: true }),
    );
    assert.deepEqual(cs.texts, chat.choices.map((c) => c.message.content));
  } finally {
    await rt.close();
  }
});

Deno.test("n and best_of beyond the limits answer 400 naming the field", async () => {
  const rt = await testRuntime();
  try {
    const ai = client(rt);
    const bad = async (body: Record<string, unknown>, chat: boolean, param: string) => {
      const e = await (chat
        ? ai.chat.completions.create({ ...sampled, messages, ...body } as never)
        : ai.completions.create({ ...sampled, prompt, ...body } as never)).then(
          () =>
            null,
          (e) => e,
        );
      assert.ok(e instanceof OpenAI.APIError, JSON.stringify(body));
      assert.equal(e.status, 400, JSON.stringify(body));
      assert.equal((e.error as { param?: string }).param, param, JSON.stringify(body));
    };
    await bad({ n: 17 }, false, "n");
    await bad({ n: 17 }, true, "n");
    await bad({ best_of: 17 }, false, "best_of");
    await bad({ n: 3, best_of: 2 }, false, "best_of");
    await bad({ best_of: 2, stream: true }, false, "best_of");
    await bad({ best_of: 2 }, true, "best_of");
    await bad({ n: 0 }, false, "n");
  } finally {
    await rt.close();
  }
});

Deno.test("n=4 prefills the prompt once: the other choices fork its KV", async () => {
  // Room for four separate requests, so a route that prefilled each choice would not block.
  const rt = await testRuntime({ tier: { concurrency: 8, queue_depth: 8 } });
  try {
    const ai = client(rt);
    const labels = { tier: "fast", kind: "prefill" };
    const before = rt.metrics.stepTokens.get(labels);
    const r = await ai.completions.create({ ...sampled, prompt, n: 4, seed: 3 });
    assert.equal(r.choices.length, 4);
    assert.equal(rt.metrics.stepTokens.get(labels) - before, r.usage!.prompt_tokens);
  } finally {
    await rt.close();
  }
});

Deno.test("choices share the prompt's blocks: each needs one free block of its own now, else 429", async () => {
  const rt = await testRuntime();
  const tier = rt.tiers.get("fast")!;
  const pool = tier.batch!.pool;
  const hog = pool.createSequence(pool.blocksTotal * pool.blockTokens);
  try {
    const ai = client(rt);
    // Held elsewhere: all but the prompt's own blocks and the scheduler's watermark (what a new
    // prefill must leave free), so choice 0 prefills and its forks find fewer free blocks than
    // choices.
    const per = Math.ceil(tier.model.tokenizer.encode(prompt).length / pool.blockTokens);
    const watermark = Math.max(1, Math.floor(pool.blocksTotal / 32));
    hog.setLength((pool.blocksFree - per - watermark) * pool.blockTokens);
    const n = watermark + 2;
    assert.deepEqual(await status(ai.completions.create({ ...sampled, prompt, n })), {
      status: 429,
      param: null,
    });
    hog.setLength(0);
    assert.equal((await ai.completions.create({ ...sampled, prompt, n })).choices.length, n);
    assert.equal(pool.blocksFree, pool.blocksTotal);
  } finally {
    hog.free();
    await rt.close();
  }
});

Deno.test("n choices of a long prompt fit a pool that holds the prompt once; ones it never holds get 400", async () => {
  const rt = await testRuntime({ tier: { kv_pool_mb: 1 } }); // 32 blocks of 16 tokens
  try {
    const pool = rt.tiers.get("fast")!.batch!.pool;
    assert.equal(pool.blocksTotal, 32);
    const ai = client(rt);
    // 400 tokens: 25 blocks. Four copies would need 100; shared, the choices need 25 + 3.
    const long = Array.from({ length: 400 }, (_, i) => 100 + (i % 50));
    const r = await ai.completions.create({ ...sampled, prompt: long, n: 4, seed: 9 });
    assert.equal(r.choices.length, 4);
    const one = await ai.completions.create({ ...sampled, prompt: long, seed: 10 });
    assert.equal(r.choices[1].text, one.choices[0].text);
    // 25 shared + 15 blocks of the choices' own exceed the whole pool: no wait would help.
    assert.deepEqual(await status(ai.completions.create({ ...sampled, prompt: long, n: 16 })), {
      status: 400,
      param: "n",
    });
    assert.deepEqual(
      await status(ai.completions.create({ ...sampled, prompt: long, best_of: 16 })),
      { status: 400, param: "best_of" },
    );
    // Nothing leaked: once the requests are done, every block is free or held by the prefix
    // cache alone (the prompt's full blocks), and evicting those frees them.
    const cache = rt.tiers.get("fast")!.batch!.cache;
    assert.equal(cache.blocks, 25);
    assert.equal(pool.blocksFree + cache.blocks, pool.blocksTotal);
    assert.equal(cache.clear(), 25);
    assert.equal(pool.blocksFree, pool.blocksTotal);
  } finally {
    await rt.close();
  }
});

Deno.test("n on a tier without batching forks its own sequences; response_format holds per choice", async () => {
  const rt = await testRuntime({ tier: { batching: false } });
  try {
    assert.equal(rt.tiers.get("fast")!.batch, null);
    const ai = client(rt);
    const r = await ai.completions.create({ ...sampled, prompt, n: 2, seed: 11, logprobs: 1 });
    for (let i = 0; i < 2; i++) {
      const one = await ai.completions.create({ ...sampled, prompt, seed: 11 + i, logprobs: 1 });
      assert.equal(r.choices[i].text, one.choices[0].text);
      assert.deepEqual(r.choices[i].logprobs, one.choices[0].logprobs);
    }
    const j = await ai.chat.completions.create({
      ...sampled,
      max_tokens: 64,
      messages,
      n: 3,
      seed: 2,
      response_format: { type: "json_object" },
    });
    assert.equal(j.choices.length, 3);
    for (const c of j.choices) {
      // Each choice has its own matcher: a shared one would reject the second choice's tokens.
      if (c.finish_reason === "stop") assert.equal(typeof JSON.parse(c.message.content!), "object");
      else assert.match(c.message.content!, /^\s*\{/);
    }
  } finally {
    await rt.close();
  }
});
