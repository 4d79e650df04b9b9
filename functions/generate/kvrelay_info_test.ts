// Route tests of what answers say about the handoff (the playground shows these fields): a streamed
// chat carries the kvrelay object on its first chunk and, with its speed, on the finishing one; an
// escalation refused by the projector gate says why with a stable code; a migrated escalation
// names the previous tier. Oracle: the same request answered without streaming.
import assert from "node:assert/strict";
import { type Json, post, readSse, testRuntime } from "../shared/test_helpers.ts";
import { createGenerateApp } from "./app.ts";

const first = "The ship sailed out of the harbour at dawn, and the crew watched the town grow " +
  "small behind them while the gulls followed the wake.";

function runtime(minQuality: number) {
  return testRuntime({
    tiers: { fast: "tiny-fast", powerful: "tiny-powerful" },
    config: {
      default_tier: "fast",
      projectors: [{
        from: "fast",
        to: "powerful",
        path: "projectors/tiny-fast--tiny-powerful",
        min_quality: minQuality,
      }],
    },
  });
}

Deno.test("streamed chat: kvrelay on the first chunk and, with ttft_ms and tokens_per_second, on the finishing chunk", async () => {
  const rt = await runtime(0.5);
  try {
    const app = createGenerateApp(rt);
    const body = {
      model: "fast",
      messages: [{ role: "user", content: first }],
      max_tokens: 12,
      temperature: 0,
    };
    const frames: Json[] = await readSse(
      await app.request("/v1/chat/completions", post({ ...body, stream: true })),
    );
    const chunks = frames.filter((f) => f !== "[DONE]");
    const finishing = chunks.find((f) => f.choices[0]?.finish_reason);
    assert.equal(chunks[0].kvrelay.tier, "fast");
    assert.equal(chunks[0].kvrelay.route, "explicit");
    assert.equal(chunks[0].kvrelay.ttft_ms, undefined);
    assert.ok(finishing.kvrelay.ttft_ms > 0);
    assert.ok(finishing.kvrelay.tokens_per_second > 0);
    const whole = await (await app.request("/v1/chat/completions", post(body))).json();
    const text = chunks.map((f) => f.choices[0]?.delta?.content ?? "").join("");
    assert.equal(text, whole.choices[0].message.content);
    assert.deepEqual(
      { ...finishing.kvrelay, ttft_ms: 0, tokens_per_second: 0 },
      { ...whole.kvrelay, cache: finishing.kvrelay.cache, ttft_ms: 0, tokens_per_second: 0 },
    );
  } finally {
    await rt.close();
  }
});

Deno.test("an escalation says why it was not migrated (cache.reason_code) and names the previous tier", async () => {
  for (
    const [minQuality, source, code] of [[0.5, "migrated", null], [
      0.9999,
      "fallback",
      "quality_below_threshold",
    ]] as const
  ) {
    const rt = await runtime(minQuality);
    try {
      const app = createGenerateApp(rt);
      const ask = async (prompt: string) =>
        await (await app.request("/v1/generate", post({ prompt, user_id: "u", max_tokens: 4 })))
          .json();
      assert.equal((await ask(first)).tier, "fast");
      const up = await ask(`${first} Explain why.`);
      assert.equal(up.tier, "powerful");
      assert.equal(up.previous_tier, "fast");
      assert.equal(up.cache.source, source, `min_quality ${minQuality}`);
      assert.equal(up.cache.reason_code, code);
      assert.equal(up.cache.from_tier, "fast");
      assert.ok(up.tokens_per_second === null || up.tokens_per_second > 0);
    } finally {
      await rt.close();
    }
  }
});
