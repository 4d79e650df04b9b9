// Route tests for the generate function via app.request(), over the real demo models: every
// endpoint (probes, /v1/models, /v1/generate, completions, chat, streaming) and every error
// status; generated text is checked against lib/engine generate() (greedy), the oracle.
import assert from "node:assert/strict";
import { continueFrom, generate } from "../../lib/engine/mod.ts";
import { endpointOf, loadProjector, migrateKv } from "../../lib/migrate/mod.ts";
import { createGenerateApp } from "./app.ts";
import { metricValue, post, readSse, testRuntime } from "../shared/test_helpers.ts";

Deno.test("GET /healthz, /readyz, /metrics answer; /readyz is 503 before models load", async () => {
  const cold = await testRuntime({ load: false });
  try {
    const app = createGenerateApp(cold);
    assert.deepEqual(await (await app.request("/healthz")).json(), { status: "ok" });
    const notReady = await app.request("/readyz");
    assert.equal(notReady.status, 503);
    const notReadyBody = await notReady.json();
    assert.equal(notReadyBody.error.type, "unavailable_error");
    assert.deepEqual(notReadyBody.tiers, { fast: { state: "loading" } });
    const gen = await app.request("/v1/generate", post({ prompt: "hi", user_id: "u" }));
    assert.equal(gen.status, 503);
    await cold.load();
    const ready = await app.request("/readyz");
    assert.equal(ready.status, 200);
    const readyBody = await ready.json();
    assert.deepEqual(readyBody.tiers, ["fast"]);
    // Where the start went: each phase of the tier's load, measured.
    assert.equal(readyBody.startup.tiers.fast.state, "ready");
    for (const phase of ["checkpoint", "tokenizer", "weights"]) {
      assert.ok(readyBody.startup.tiers.fast.loadMs[phase] > 0, phase);
    }
    assert.ok(readyBody.startup.readyMs >= readyBody.startup.loadStartedMs);
    const metrics = await app.request("/metrics");
    assert.match(metrics.headers.get("content-type")!, /^text\/plain; version=0\.0\.4/);
    const text = await metrics.text();
    assert.match(text, /# TYPE kvrelay_http_requests_total counter/);
    assert.equal(
      metricValue(
        text,
        'kvrelay_http_requests_total{function="generate",route="/readyz",status="503"}',
      ),
      1,
    );
  } finally {
    await cold.close();
  }
});

Deno.test("GET /readyz is 503 naming the tier when its device has failed (kvr_model_health)", async () => {
  const rt = await testRuntime();
  try {
    const app = createGenerateApp(rt);
    assert.equal((await app.request("/readyz")).status, 200);
    // A CUDA kernel fault marks the backend failed; the CPU never fails, so stand one in.
    const native = rt.tiers.get("fast")!.model.native;
    native.health = () => "CUDA device 0 failed: cudaErrorIllegalAddress (700)";
    const res = await app.request("/readyz");
    assert.equal(res.status, 503);
    const body = await res.json();
    assert.equal(body.error.type, "unavailable_error");
    assert.equal(
      body.error.message,
      "tier fast: CUDA device 0 failed: cudaErrorIllegalAddress (700)",
    );
  } finally {
    await rt.close();
  }
});

Deno.test("GET /v1/models lists one model id per tier", async () => {
  const rt = await testRuntime({ tiers: { fast: "tiny-fast", balanced: "tiny-balanced" } });
  try {
    const res = await createGenerateApp(rt).request("/v1/models");
    const body = await res.json();
    assert.equal(body.object, "list");
    assert.deepEqual(body.data.map((m: { id: string }) => m.id), ["fast", "balanced"]);
    assert.equal(body.data[1].root, "tiny-balanced");
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/generate returns engine generate()'s greedy text with the seed's fields", async () => {
  const rt = await testRuntime();
  try {
    const app = createGenerateApp(rt);
    const prompt = "It was the best of times";
    const expected = await generate(rt.tiers.get("fast")!.model, prompt, {
      maxTokens: 10,
      temperature: 0,
    });
    const res = await app.request(
      "/v1/generate",
      post({ prompt, user_id: "alice", max_tokens: 10 }),
    );
    assert.equal(res.status, 200);
    const body = await res.json();
    assert.equal(body.response, expected.text);
    assert.equal(body.tier, "fast");
    assert.equal(body.migrated, false);
    assert.equal(body.tokens, expected.tokenIds.length);
    assert.match(body.request_id, /^gen-[0-9a-f-]{36}$/);
    assert.equal(typeof body.ttft_ms, "number");
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/completions matches generate() for a string and for an array of prompts", async () => {
  const rt = await testRuntime();
  try {
    const app = createGenerateApp(rt);
    const model = rt.tiers.get("fast")!.model;
    const prompts = ["The ship sailed", "Once upon a time"];
    const expected = await Promise.all(
      prompts.map((p) => generate(model, p, { maxTokens: 6, temperature: 0 })),
    );
    const one = await (await app.request(
      "/v1/completions",
      post({ model: "fast", prompt: prompts[0], max_tokens: 6 }),
    )).json();
    assert.equal(one.object, "text_completion");
    assert.equal(one.choices[0].text, expected[0].text);
    assert.equal(one.choices[0].finish_reason, "length");
    assert.equal(one.usage.prompt_tokens, model.tokenizer.encode(prompts[0]).length);
    const many = await (await app.request(
      "/v1/completions",
      post({ model: "fast", prompt: prompts, max_tokens: 6 }),
    )).json();
    assert.deepEqual(
      many.choices.map((c: { text: string }) => c.text),
      expected.map((e) => e.text),
    );
    assert.deepEqual(many.choices.map((c: { index: number }) => c.index), [0, 1]);
    assert.equal(
      many.usage.completion_tokens,
      expected[0].tokenIds.length + expected[1].tokenIds.length,
    );
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/completions streams SSE deltas ending in [DONE] with usage when asked", async () => {
  const rt = await testRuntime();
  try {
    const app = createGenerateApp(rt);
    const prompt = "The ship sailed";
    const expected = await generate(rt.tiers.get("fast")!.model, prompt, {
      maxTokens: 8,
      temperature: 0,
    });
    const res = await app.request(
      "/v1/completions",
      post({
        model: "fast",
        prompt,
        max_tokens: 8,
        stream: true,
        stream_options: { include_usage: true },
      }),
    );
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type")!, /^text\/event-stream/);
    const frames = await readSse(res);
    assert.equal(frames.at(-1), "[DONE]");
    const usage = frames.at(-2)!;
    assert.deepEqual(usage.choices, []);
    assert.equal(usage.usage.completion_tokens, expected.tokenIds.length);
    const chunks = frames.slice(0, -2);
    assert.equal(chunks.map((f) => f.choices[0].text).join(""), expected.text);
    assert.equal(chunks.at(-1)!.choices[0].finish_reason, "length");
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/chat/completions answers and streams the chat-template prompt's greedy text", async () => {
  const rt = await testRuntime();
  try {
    const app = createGenerateApp(rt);
    const model = rt.tiers.get("fast")!.model;
    const messages = [{ role: "user", content: "Tell me about the sea." }];
    const expected = await generate(
      model,
      model.tokenizer.applyChatTemplate(messages, { addGenerationPrompt: true }),
      {
        maxTokens: 8,
        temperature: 0,
      },
    );
    const res = await app.request(
      "/v1/chat/completions",
      post({ model: "fast", messages, max_tokens: 8 }),
    );
    const body = await res.json();
    assert.equal(body.object, "chat.completion");
    assert.equal(body.choices[0].message.role, "assistant");
    assert.equal(body.choices[0].message.content, expected.text);
    assert.equal(body.usage.completion_tokens, expected.tokenIds.length);
    const s = await app.request(
      "/v1/chat/completions",
      post({ model: "fast", messages, max_tokens: 8, stream: true }),
    );
    const frames = await readSse(s);
    assert.equal(frames.at(-1), "[DONE]");
    assert.equal(frames[0].choices[0].delta.role, "assistant");
    const content = frames.slice(0, -1).map((f) => f.choices[0].delta.content ?? "").join("");
    assert.equal(content, expected.text);
    assert.equal(frames.at(-2)!.choices[0].finish_reason, "length");
    assert.equal(frames.at(-2)!.usage, undefined);
  } finally {
    await rt.close();
  }
});

Deno.test("invalid bodies answer 400 naming the field; unknown model 404; huge body 413", async () => {
  const rt = await testRuntime();
  try {
    const app = createGenerateApp(rt);
    const cases: [string, unknown, string][] = [
      ["/v1/completions", { prompt: "" }, "prompt"],
      ["/v1/completions", { prompt: "hi", max_tokens: 0 }, "max_tokens"],
      ["/v1/completions", { prompt: "hi", temperature: -1 }, "temperature"],
      ["/v1/completions", { prompt: "hi", max_tokens: 100000 }, "max_tokens"],
      ["/v1/chat/completions", { messages: [] }, "messages"],
      ["/v1/chat/completions", { messages: [{ role: "wizard", content: "x" }] }, "messages.0.role"],
      ["/v1/generate", { prompt: "hi" }, "user_id"],
    ];
    for (const [path, body, param] of cases) {
      const res = await app.request(path, post(body));
      assert.equal(res.status, 400, `${path} ${JSON.stringify(body)}`);
      const json = await res.json();
      assert.equal(json.error.type, "invalid_request_error");
      assert.equal(json.error.param, param);
      assert.equal(JSON.stringify(json).includes("    at "), false, "no stack trace");
    }
    const bad = await app.request("/v1/completions", post(null, {}, "{not json"));
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.param, "body");
    const unknown = await app.request("/v1/completions", post({ model: "nope", prompt: "hi" }));
    assert.equal(unknown.status, 404);
    assert.equal((await unknown.json()).error.param, "model");
    const route = await app.request("/v1/nothing");
    assert.equal(route.status, 404);
    const huge = await app.request("/v1/completions", post({ prompt: "x".repeat(10_000) }));
    assert.equal(huge.status, 413);
  } finally {
    await rt.close();
  }
});

Deno.test("API keys: 401 without or with a wrong key, 200 with a right one; probes stay open", async () => {
  const rt = await testRuntime({ env: { KVRELAY_API_KEYS: "k-one, k-two" } });
  try {
    const app = createGenerateApp(rt);
    const body = { model: "fast", prompt: "hi", max_tokens: 2 };
    const none = await app.request("/v1/completions", post(body));
    assert.equal(none.status, 401);
    assert.equal((await none.json()).error.type, "authentication_error");
    assert.equal(
      (await app.request("/v1/completions", post(body, { authorization: "Bearer k-three" })))
        .status,
      401,
    );
    assert.equal(
      (await app.request("/v1/completions", post(body, { authorization: "Bearer k-two" }))).status,
      200,
    );
    // Every configured key is accepted (bearerAuth's verifyToken compares against all of them).
    assert.equal(
      (await app.request("/v1/completions", post(body, { authorization: "Bearer k-one" }))).status,
      200,
    );
    assert.equal((await app.request("/healthz")).status, 200);
  } finally {
    await rt.close();
  }
});

Deno.test("a full queue answers 429 with Retry-After; the admitted requests complete as alone", async () => {
  // queue_depth 1: of five requests at once, the first waits to start and the ones admitted
  // while it does are refused (a batching tier bounds the requests waiting, not those running).
  const rt = await testRuntime({ tier: { concurrency: 1, queue_depth: 1 } });
  try {
    const app = createGenerateApp(rt);
    const body = post({ model: "fast", prompt: "The ship sailed on the sea", max_tokens: 24 });
    const results = await Promise.all(
      [1, 2, 3, 4, 5].map(() => app.request("/v1/completions", body)),
    );
    const statuses = results.map((r) => r.status).sort();
    assert.ok(statuses.includes(429), `statuses ${statuses}`);
    assert.ok(statuses.includes(200), `statuses ${statuses}`);
    assert.ok(statuses.every((s) => s === 200 || s === 429));
    const refused = results.find((r) => r.status === 429)!;
    assert.ok(Number(refused.headers.get("retry-after")) >= 1);
    assert.equal((await refused.json()).error.type, "rate_limit_error");
    const alone = (await (await app.request("/v1/completions", body)).json()).choices[0].text;
    for (const r of results) {
      if (r.status === 200) assert.equal((await r.json()).choices[0].text, alone);
    }
    for (const r of results) if (!r.bodyUsed) await r.body?.cancel();
  } finally {
    await rt.close();
  }
});

Deno.test("router: keyword rule picks the higher tier; explicit model wins; a conversation only escalates", async () => {
  const rt = await testRuntime({ tiers: { fast: "tiny-fast", powerful: "tiny-powerful" } });
  try {
    const app = createGenerateApp(rt);
    const ask = async (body: Record<string, unknown>) =>
      await (await app.request("/v1/generate", post({ max_tokens: 2, ...body }))).json();
    assert.equal((await ask({ prompt: "The ship", user_id: "a" })).tier, "fast");
    const escalated = await ask({ prompt: "Please explain the ship", user_id: "a" });
    assert.equal(escalated.tier, "powerful");
    assert.equal(escalated.route, "rule");
    const sticky = await ask({ prompt: "The ship", user_id: "a" });
    assert.equal(sticky.tier, "powerful");
    assert.equal(sticky.route, "sticky");
    assert.equal(
      (await ask({ prompt: "Please explain", user_id: "b", tier: "fast" })).tier,
      "fast",
    );
  } finally {
    await rt.close();
  }
});

Deno.test("escalation: same-model tiers share the prefix cache; without a projector it falls back", async () => {
  // Same model under two tier names: prefix keys are seeded by the model fingerprint, so the
  // second tier finds the first's chunks (exact reuse, equal to a plain greedy run); a different
  // model without a usable projector must fall back to a full prefill and say so.
  const rt = await testRuntime({
    tiers: { fast: "tiny-fast", fast2: "tiny-fast", powerful: "tiny-powerful" },
    config: { prefix_cache: { chunk_tokens: 8 } },
  });
  try {
    const app = createGenerateApp(rt);
    const prompt = "It was the best of times, it was the worst of times, it was the age of wisdom";
    const first = await (await app.request(
      "/v1/generate",
      post({ prompt, user_id: "u", tier: "fast", max_tokens: 2 }),
    )).json();
    assert.equal(first.cache.source, "none");
    const copy = await (await app.request(
      "/v1/generate",
      post({ prompt: prompt + " and", user_id: "u", tier: "fast2", max_tokens: 8 }),
    )).json();
    assert.equal(copy.migrated, false);
    assert.equal(copy.cache.source, "prefix");
    assert.equal(copy.cache.reused_tokens, 16);
    const expected = await generate(rt.tiers.get("fast2")!.model, prompt + " and", {
      maxTokens: 8,
      temperature: 0,
    });
    assert.equal(copy.response, expected.text);
    const up = await (await app.request(
      "/v1/generate",
      post({ prompt: prompt + " or", user_id: "v", tier: "powerful", max_tokens: 4 }),
    )).json();
    assert.equal(up.migrated, false);
    assert.equal(up.cache.source, "fallback");
    assert.match(up.cache.reason, /projector/);
    const again = await (await app.request(
      "/v1/generate",
      post({ prompt: prompt + " or", user_id: "v", tier: "powerful", max_tokens: 4 }),
    )).json();
    assert.equal(again.cache.source, "prefix");
    assert.equal(again.response, up.response);
    const metrics = await (await app.request("/metrics")).text();
    assert.equal(
      metricValue(metrics, 'kvrelay_migration_fallbacks_total{from="fast",to="powerful"}'),
      1,
    );
    assert.ok(metricValue(metrics, 'kvrelay_prefix_cache_hits_total{tier="powerful"}') >= 1);
  } finally {
    await rt.close();
  }
});

Deno.test("/healthz answers while a long prefill runs (native calls do not block the event loop)", async () => {
  const rt = await testRuntime({
    tiers: { powerful: "tiny-powerful" },
    tier: { max_context: 4096, threads: 1 },
    config: { server: { max_body_bytes: 1 << 20 } },
  });
  try {
    const app = createGenerateApp(rt);
    const prompt = "the sea and the ship ".repeat(500);
    let generationDone = false;
    const long = Promise.resolve(app.request("/v1/completions", post({ prompt, max_tokens: 1 })))
      .then((r) => {
        generationDone = true;
        return r;
      });
    await new Promise((r) => setTimeout(r, 30));
    const t0 = performance.now();
    const health = await app.request("/healthz");
    const healthMs = performance.now() - t0;
    assert.equal(health.status, 200);
    assert.equal(generationDone, false, "health answered only after the prefill finished");
    const res = await long;
    assert.equal(res.status, 200);
    await res.body?.cancel();
    assert.ok(healthMs < 200, `healthz took ${healthMs.toFixed(1)} ms`);
  } finally {
    await rt.close();
  }
});

// The demo projector is committed: its absence is a failure, not a reason to skip.

Deno.test({
  name:
    "escalation migrates the lower tier's cached prefix through the projector when the gate allows",
  fn: async () => {
    const rt = await testRuntime({
      tiers: { fast: "tiny-fast", powerful: "tiny-powerful" },
      config: {
        prefix_cache: { chunk_tokens: 8 },
        projectors: [{
          from: "fast",
          to: "powerful",
          path: "projectors/tiny-fast--tiny-powerful",
          min_quality: 0.5,
        }],
      },
    });
    try {
      const app = createGenerateApp(rt);
      const prompt =
        "It was the best of times, it was the worst of times, it was the age of wisdom, it was";
      await (await app.request(
        "/v1/generate",
        post({ prompt, user_id: "m", tier: "fast", max_tokens: 2 }),
      )).json();
      const up = await (await app.request(
        "/v1/generate",
        post({ prompt: prompt + " the", user_id: "m", tier: "powerful", max_tokens: 6 }),
      ))
        .json();
      assert.equal(up.migrated, true, JSON.stringify(up.cache));
      assert.equal(up.cache.source, "migrated");
      assert.equal(up.cache.from_tier, "fast");
      assert.ok(up.cache.reused_tokens > 0);
      const metrics = await (await app.request("/metrics")).text();
      assert.equal(metricValue(metrics, 'kvrelay_migrations_total{from="fast",to="powerful"}'), 1);
      // Oracle: the same migration in-process (as tests/handoff_test.ts): fast's KV of the first
      // prompt (what its prefix cache stored), projected for the reused positions, the rest
      // prefilled by powerful, then greedy decoding.
      const fast = rt.tiers.get("fast")!.model, powerful = rt.tiers.get("powerful")!.model;
      const ids1 = fast.tokenizer.encode(prompt);
      const ids2 = powerful.tokenizer.encode(prompt + " the");
      const keep = up.cache.reused_tokens as number;
      const projector = await loadProjector(
        new URL("../../models/projectors/tiny-fast--tiny-powerful", import.meta.url).pathname,
        endpointOf(fast),
        endpointOf(powerful),
      );
      const src = fast.native.createSequence(ids1.length);
      const tgt = powerful.native.createSequence(ids2.length + 8);
      try {
        await src.prefill(ids1);
        await migrateKv({
          source: endpointOf(fast),
          sourceSeq: src,
          target: endpointOf(powerful),
          targetSeq: tgt,
          projector,
          count: keep,
          threads: 1,
        });
        const logits = await tgt.prefill(ids2.slice(keep));
        const want = await continueFrom(powerful, tgt, logits, {
          maxTokens: 6,
          temperature: 0,
          contextIds: ids2.slice(-8),
        });
        assert.equal(up.response, want.text);
      } finally {
        src.free();
        tgt.free();
        await projector.free();
      }
    } finally {
      await rt.close();
    }
  },
});

Deno.test("a request past the tier's timeout answers 503 timeout_error and frees its sequence", async () => {
  const rt = await testRuntime({
    tiers: { powerful: "tiny-powerful" },
    tier: { request_timeout_ms: 1 },
  });
  try {
    const app = createGenerateApp(rt);
    const res = await app.request(
      "/v1/completions",
      post({ prompt: "The ship sailed on the sea", max_tokens: 100 }),
    );
    assert.equal(res.status, 503);
    const body = await res.json();
    assert.equal(body.error.type, "timeout_error");
    const metrics = await (await app.request("/metrics")).text();
    assert.equal(metricValue(metrics, 'kvrelay_active_sequences{tier="powerful"}'), 0);
    // The deadline counts from the request's arrival, so a 1 ms deadline has usually passed
    // before admission (no generation started); when it passes while decoding, the abort counts.
    assert.ok(
      metricValue(metrics, 'kvrelay_generations_aborted_total{cause="timeout",tier="powerful"}') <=
        1,
    );
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/completions checks every prompt before running any: 400 naming prompt.i, no tokens generated", async () => {
  const rt = await testRuntime(); // max_context 512
  try {
    const app = createGenerateApp(rt);
    const tooLong = Array.from({ length: 600 }, () => 1);
    const cases: [unknown, string, string][] = [
      [[[1, 2], [1, 9999]], "prompt.1.1", "invalid_request_error"],
      [[[1, 2], tooLong], "prompt.1", "context_length_exceeded"],
      [["Hello", "x ".repeat(600)], "prompt.1", "context_length_exceeded"],
      [tooLong, "prompt", "context_length_exceeded"],
    ];
    for (const stream of [false, true]) {
      for (const [prompt, param, type] of cases) {
        const res = await app.request(
          "/v1/completions",
          post({ prompt, max_tokens: 4, stream }),
        );
        assert.equal(res.status, 400, `stream ${stream}, ${param}`);
        const body = await res.json();
        assert.equal(body.error.type, type);
        assert.equal(body.error.param, param);
      }
    }
    const metrics = await (await app.request("/metrics")).text();
    assert.equal(metricValue(metrics, 'kvrelay_generated_tokens_total{tier="fast"}'), 0);
  } finally {
    await rt.close();
  }
});

Deno.test("union fields answer 400 saying which shapes they accept", async () => {
  const rt = await testRuntime();
  try {
    const app = createGenerateApp(rt);
    const cases: [string, unknown, string, RegExp][] = [
      ["/v1/completions", { prompt: [1.5] }, "prompt", /token ids/],
      ["/v1/completions", { prompt: [] }, "prompt", /token ids/],
      ["/v1/completions", { prompt: "hi", stop: ["a", "b", "c", "d", "e"] }, "stop", /at most 4/],
      [
        "/v1/chat/completions",
        { messages: [{ role: "user", content: [{ type: "image_url" }] }] },
        "messages.0.content",
        /"type": "text"/,
      ],
    ];
    for (const [path, body, param, message] of cases) {
      const res = await app.request(path, post(body));
      assert.equal(res.status, 400, JSON.stringify(body));
      const json = await res.json();
      assert.equal(json.error.param, param);
      assert.match(json.error.message, message);
    }
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/chat/completions names max_completion_tokens when that is the field over a limit", async () => {
  const rt = await testRuntime(); // max_new_tokens 128, max_context 512
  try {
    const app = createGenerateApp(rt);
    const messages = [{ role: "user", content: "hi" }];
    const res = await app.request(
      "/v1/chat/completions",
      post({ messages, max_completion_tokens: 100000 }),
    );
    assert.equal(res.status, 400);
    const body = await res.json();
    assert.equal(body.error.param, "max_completion_tokens");
    assert.match(body.error.message, /^max_completion_tokens 100000 /);
    const plain = await app.request("/v1/chat/completions", post({ messages, max_tokens: 100000 }));
    assert.equal((await plain.json()).error.param, "max_tokens");
  } finally {
    await rt.close();
  }
});

Deno.test("a JSON body that breaks off mid-upload answers 400 naming body, not 500", async () => {
  const rt = await testRuntime();
  try {
    const app = createGenerateApp(rt);
    const broken = new ReadableStream<Uint8Array>({
      start(ctl) {
        ctl.enqueue(new TextEncoder().encode('{"prompt": "hel'));
      },
      pull(ctl) {
        ctl.error(new Error("connection reset by peer"));
      },
    });
    const res = await app.request("/v1/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: broken,
    });
    assert.equal(res.status, 400);
    const body = await res.json();
    assert.equal(body.error.param, "body");
    assert.match(body.error.message, /could not be read: connection reset by peer/);
  } finally {
    await rt.close();
  }
});
