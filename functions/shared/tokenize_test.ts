// Tokenization under hostile prompt sizes via app.request(): a prompt longer than the context can
// hold is refused before any tokenizing, and long prompts within the bound are tokenized on the
// tokenizer's worker thread (the event loop's encode never sees them) while /healthz answers.
import assert from "node:assert/strict";
import { generate } from "../../lib/engine/mod.ts";
import type { Runtime } from "../../lib/serve/mod.ts";
import { createGenerateApp } from "../generate/app.ts";
import { post, testRuntime } from "./test_helpers.ts";

/** Counts main-thread encode calls with texts of at least `minChars` on every tier. */
function spyEncode(rt: Runtime, minChars: number): { long: number; all: number } {
  const counts = { long: 0, all: 0 };
  for (const t of rt.tiers.values()) {
    const tok = t.model.tokenizer;
    const orig = tok.encode.bind(tok);
    tok.encode = (text, opts) => {
      counts.all++;
      if (text.length >= minChars) counts.long++;
      return orig(text, opts);
    };
  }
  return counts;
}

const big = { server: { max_body_bytes: 4 << 20, max_snapshot_bytes: 1 << 20 } };

Deno.test("a prompt longer than max_context tokens can cover is refused unread: 400 context_length_exceeded", async () => {
  const rt = await testRuntime({
    tiers: { fast: "tiny-fast", powerful: "tiny-powerful" },
    config: big,
  });
  try {
    const app = createGenerateApp(rt);
    const counts = spyEncode(rt, 0);
    const prompt = "All work and no play makes Jack a dull boy. ".repeat(24000); // ~1 MB
    for (
      const [url, body, param] of [
        ["/v1/completions", { prompt }, "prompt"],
        ["/v1/completions", { model: "fast", prompt: ["hi", prompt] }, "prompt.1"],
        ["/v1/chat/completions", { messages: [{ role: "user", content: prompt }] }, "messages"],
        ["/v1/generate", { prompt, user_id: "u" }, "prompt"],
      ] as const
    ) {
      const t0 = performance.now();
      const res = await app.request(url, post(body));
      const ms = performance.now() - t0;
      assert.equal(res.status, 400, url);
      const err = (await res.json()).error;
      assert.equal(err.type, "context_length_exceeded", url);
      assert.equal(err.param, param, url);
      assert.match(err.message, /characters/);
      assert.ok(ms < 1000, `${url}: refused after ${Math.round(ms)} ms`);
    }
    assert.equal(counts.all, 1, "only the short prompt 0 was tokenized");
  } finally {
    await rt.close();
  }
});

Deno.test("long prompts are tokenized off the event loop and give the same text; /healthz answers meanwhile", async () => {
  const rt = await testRuntime({
    tier: { max_context: 2048, concurrency: 4 },
    config: big,
  });
  try {
    const app = createGenerateApp(rt);
    const counts = spyEncode(rt, 4096);
    const model = rt.tiers.get("fast")!.model;
    // Just under the character bound (2048 tokens × 16 characters × 4): tokenizing takes long,
    // the prompt then overflows max_context (a 400 after tokenizing).
    const long = "The quick brown fox jumps over the lazy dog. ".repeat(2900);
    const lags: number[] = [];
    let running = true;
    const probe = (async () => {
      while (running) {
        const t0 = performance.now();
        const res = await app.request("/healthz");
        await res.body?.cancel();
        lags.push(performance.now() - t0);
        await new Promise((r) => setTimeout(r, 5));
      }
    })();
    const answers = await Promise.all(
      [0, 1, 2, 3].map(() => app.request("/v1/completions", post({ prompt: long, max_tokens: 1 }))),
    );
    running = false;
    await probe;
    for (const r of answers) {
      assert.equal(r.status, 400);
      assert.equal((await r.json()).error.type, "context_length_exceeded");
    }
    assert.equal(counts.long, 0, "a long text was encoded on the event loop");
    // Same ids off-thread as inline: a long prompt that fits decodes like generate().
    const fits = "Once upon a time, in a quiet village by the sea, ".repeat(100);
    const res = await app.request("/v1/completions", post({ prompt: fits, max_tokens: 4 }));
    assert.equal(res.status, 200);
    const want = await generate(model, fits, { maxTokens: 4, temperature: 0 });
    assert.equal((await res.json()).choices[0].text, want.text);
    lags.sort((a, b) => a - b);
    console.log(
      `healthz during 4 long tokenizations: n=${lags.length} p50=${
        lags[lags.length >> 1]?.toFixed(1)
      } ms max=${lags.at(-1)?.toFixed(1)} ms`,
    );
  } finally {
    await rt.close();
  }
});
