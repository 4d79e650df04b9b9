// Route tests for the prefill function via app.request(): the streamed snapshot, the stored
// snapshot id, handing off to a peer decode function over HTTP, and its error statuses. The
// oracle for continued text is lib/engine generate() on the same prompt (greedy).
import assert from "node:assert/strict";
import { generate } from "../../lib/engine/mod.ts";
import { decodeHeader } from "../../lib/snapshot/mod.ts";
import { createDecodeApp } from "../decode/app.ts";
import { createBaseApp } from "../shared/mod.ts";
import { post, testRuntime } from "../shared/test_helpers.ts";
import { createPrefillApp, registerPrefill } from "./app.ts";
import { registerDecode } from "../decode/app.ts";

const prompt = "It was the best of times, it was the worst of times";

Deno.test("POST /v1/prefill streams a snapshot whose decode equals generate() (greedy)", async () => {
  const rt = await testRuntime();
  try {
    const model = rt.tiers.get("fast")!.model;
    const res = await createPrefillApp(rt).request("/v1/prefill", post({ tier: "fast", prompt }));
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("content-type"), "application/vnd.kvrelay.snapshot");
    const ids = model.tokenizer.encode(prompt);
    assert.equal(res.headers.get("x-kvrelay-tokens"), String(ids.length));
    const bytes = new Uint8Array(await res.arrayBuffer());
    const { header } = decodeHeader(bytes);
    assert.deepEqual([...header.tokenIds], ids.slice(0, -1));
    assert.deepEqual([...header.pendingTokenIds], ids.slice(-1));
    const dec = await createDecodeApp(rt).request("/v1/decode?tier=fast&max_tokens=10", {
      method: "POST",
      headers: { "content-type": "application/vnd.kvrelay.snapshot" },
      body: bytes,
    });
    const body = await dec.json();
    const expected = await generate(model, prompt, { maxTokens: 10, temperature: 0 });
    assert.equal(body.text, expected.text);
    assert.equal(body.usage.completion_tokens, expected.tokenIds.length);
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/prefill with store: true answers {snapshot_id}; decode by id continues it", async () => {
  const rt = await testRuntime();
  try {
    const res = await createPrefillApp(rt).request(
      "/v1/prefill",
      post({ tier: "fast", prompt, store: true }),
    );
    const body = await res.json();
    assert.match(body.snapshot_id, /^[0-9a-f-]{36}$/);
    assert.ok(body.bytes > 0);
    const dec = await (await createDecodeApp(rt).request(
      "/v1/decode",
      post({ snapshot_id: body.snapshot_id, max_tokens: 6 }),
    ))
      .json();
    const expected = await generate(rt.tiers.get("fast")!.model, prompt, {
      maxTokens: 6,
      temperature: 0,
    });
    assert.equal(dec.text, expected.text);
    assert.equal(dec.tier, "fast");
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/prefill with forward_to hands the snapshot to a peer decode function over HTTP", async () => {
  const peerRt = await testRuntime();
  const peerApp = createBaseApp(peerRt, "decode");
  registerDecode(peerApp, peerRt);
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen: () => {} }, peerApp.fetch);
  const rt = await testRuntime({
    config: { peers: { dec: `http://127.0.0.1:${server.addr.port}` } },
  });
  try {
    const app = createBaseApp(rt, "prefill");
    registerPrefill(app, rt);
    const res = await app.request(
      "/v1/prefill",
      post({ tier: "fast", prompt, forward_to: "dec", decode: { max_tokens: 8 } }),
    );
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("x-kvrelay-handoff"), "fast->dec");
    const body = await res.json();
    const expected = await generate(rt.tiers.get("fast")!.model, prompt, {
      maxTokens: 8,
      temperature: 0,
    });
    assert.equal(body.text, expected.text);
    const unknown = await app.request(
      "/v1/prefill",
      post({ tier: "fast", prompt, forward_to: "nobody" }),
    );
    assert.equal(unknown.status, 404);
    assert.equal((await unknown.json()).error.param, "forward_to");
  } finally {
    await rt.close();
    await server.shutdown();
    await peerRt.close();
  }
});

Deno.test("POST /v1/prefill answers 400 for bad bodies and 404 for an unknown tier", async () => {
  const rt = await testRuntime();
  try {
    const app = createPrefillApp(rt);
    const both = await app.request("/v1/prefill", post({ tier: "fast", prompt: "a", tokens: [1] }));
    assert.equal(both.status, 400);
    assert.equal((await both.json()).error.param, "prompt");
    const vocab = await app.request("/v1/prefill", post({ tier: "fast", tokens: [1, 99999] }));
    assert.equal(vocab.status, 400);
    assert.equal((await vocab.json()).error.param, "tokens.1");
    const tier = await app.request("/v1/prefill", post({ tier: "huge", prompt: "a" }));
    assert.equal(tier.status, 404);
    assert.equal((await tier.json()).error.param, "tier");
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/prefill answers 404 naming forward_to for peer names that are Object.prototype members", async () => {
  const rt = await testRuntime();
  try {
    const app = createPrefillApp(rt);
    for (const name of ["constructor", "toString", "hasOwnProperty", "__proto__"]) {
      const res = await app.request(
        "/v1/prefill",
        post({ tier: "fast", prompt: "hello there", forward_to: name }),
      );
      assert.equal(res.status, 404, name);
      const body = await res.json();
      assert.equal(body.error.type, "not_found_error");
      assert.equal(body.error.param, "forward_to");
    }
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/prefill blames the prompt field it was given when the prompt reaches max_context", async () => {
  const rt = await testRuntime(); // max_context 512
  try {
    const app = createPrefillApp(rt);
    const res = await app.request(
      "/v1/prefill",
      post({ tier: "fast", tokens: Array.from({ length: 600 }, () => 1) }),
    );
    assert.equal(res.status, 400);
    const body = await res.json();
    assert.equal(body.error.type, "context_length_exceeded");
    assert.equal(body.error.param, "tokens");
  } finally {
    await rt.close();
  }
});
