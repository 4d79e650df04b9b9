// Route tests for the decode function via app.request(): continuing from a snapshot (body or
// stored id, optional continuation, SSE), and every refusal: 409 foreign model, 401 missing or
// bad signature, 400 corrupt bytes, 404 unknown id, 413 oversized. Oracle: generate() on ids.
import assert from "node:assert/strict";
import { generate } from "../../lib/engine/mod.ts";
import { createPrefillApp } from "../prefill/app.ts";
import { type Runtime, snapshotKey } from "../../lib/serve/mod.ts";
import { metricValue, post, readSse, testRuntime } from "../shared/test_helpers.ts";
import { createDecodeApp } from "./app.ts";

const prompt = "The ship sailed out of the harbour at dawn";
const SNAP = { "content-type": "application/vnd.kvrelay.snapshot" };

async function snapshotOf(rt: Runtime, tier = "fast"): Promise<Uint8Array<ArrayBuffer>> {
  const res = await createPrefillApp(rt).request("/v1/prefill", post({ tier, prompt }));
  assert.equal(res.status, 200);
  return new Uint8Array(await res.arrayBuffer());
}

Deno.test("POST /v1/decode continues with continuation text, equal to generate() on the ids", async () => {
  const rt = await testRuntime();
  try {
    const model = rt.tiers.get("fast")!.model;
    const snap = await snapshotOf(rt);
    const res = await createDecodeApp(rt).request(
      `/v1/decode?tier=fast&max_tokens=6&continuation=${encodeURIComponent(" and then")}`,
      { method: "POST", headers: SNAP, body: snap },
    );
    const body = await res.json();
    const ids = [...model.tokenizer.encode(prompt), ...model.tokenizer.encode(" and then")];
    const expected = await generate(model, ids, { maxTokens: 6, temperature: 0 });
    assert.equal(body.text, expected.text);
    assert.equal(body.snapshot_tokens, model.tokenizer.encode(prompt).length);
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/decode takes repetition_penalty, min_tokens and ignore_eos in the query", async () => {
  const rt = await testRuntime();
  try {
    const model = rt.tiers.get("fast")!.model;
    const snap = await snapshotOf(rt);
    const app = createDecodeApp(rt);
    const decode = async (q: string) => {
      const res = await app.request(`/v1/decode?tier=fast&${q}`, {
        method: "POST",
        headers: SNAP,
        body: snap,
      });
      return { status: res.status, body: await res.json() };
    };
    const ids = model.tokenizer.encode(prompt);
    const want = await generate(model, ids, {
      maxTokens: 12,
      temperature: 0,
      repetitionPenalty: 1.5,
    });
    const got = await decode("max_tokens=12&repetition_penalty=1.5");
    assert.equal(got.body.text, want.text);
    assert.notEqual(
      want.text,
      (await generate(model, ids, { maxTokens: 12, temperature: 0 })).text,
    );
    // ignore_eos: the 12 tokens run through whatever EOS the model would stop at.
    const long = await decode("max_tokens=12&ignore_eos=true&min_tokens=12");
    assert.equal(long.body.usage.completion_tokens, 12);
    const bad = await decode("max_tokens=4&min_tokens=5");
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.param, "min_tokens");
    const zero = await decode("max_tokens=4&repetition_penalty=0");
    assert.equal(zero.status, 400);
    assert.equal(zero.body.error.param, "repetition_penalty");
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/decode streams SSE text frames, then a final frame and [DONE]", async () => {
  const rt = await testRuntime();
  try {
    const snap = await snapshotOf(rt);
    const res = await createDecodeApp(rt).request("/v1/decode?max_tokens=6&stream=true", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    const frames = await readSse(res);
    assert.equal(frames.at(-1), "[DONE]");
    const last = frames.at(-2)!;
    assert.equal(last.finish_reason, "length");
    const expected = await generate(rt.tiers.get("fast")!.model, prompt, {
      maxTokens: 6,
      temperature: 0,
    });
    assert.equal(frames.slice(0, -2).map((f) => f.text).join(""), expected.text);
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/decode: 409 for a model no tier serves, 422 across tiers without a projector, 404 unknown ids", async () => {
  const rt = await testRuntime({ tiers: { fast: "tiny-fast", balanced: "tiny-balanced" } });
  const only = await testRuntime({ tiers: { balanced: "tiny-balanced" } });
  try {
    const snap = await snapshotOf(rt);
    const foreign = await createDecodeApp(only).request("/v1/decode", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(foreign.status, 409);
    assert.equal((await foreign.json()).error.type, "snapshot_mismatch_error");
    const app = createDecodeApp(rt);
    const cross = await app.request("/v1/decode?tier=balanced", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(cross.status, 422);
    assert.equal((await cross.json()).error.type, "migration_refused_error");
    const missing = await app.request("/v1/decode", post({ snapshot_id: crypto.randomUUID() }));
    assert.equal(missing.status, 404);
    assert.equal((await missing.json()).error.param, "snapshot_id");
    const tier = await app.request("/v1/decode?tier=zzz", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(tier.status, 404);
  } finally {
    await rt.close();
    await only.close();
  }
});

// The demo projector is committed: its absence is a failure, not a reason to skip.
Deno.test({
  name:
    "POST /v1/decode migrates another tier's snapshot through the projector, then repairs and decodes",
  fn: async () => {
    const rt = await testRuntime({
      tiers: { fast: "tiny-fast", powerful: "tiny-powerful" },
      config: {
        projectors: [{ from: "fast", to: "powerful", path: "projectors/tiny-fast--tiny-powerful" }],
      },
    });
    try {
      const snap = await snapshotOf(rt);
      const res = await createDecodeApp(rt).request("/v1/decode?tier=powerful&max_tokens=6", {
        method: "POST",
        headers: SNAP,
        body: snap,
      });
      assert.equal(res.status, 200);
      const body = await res.json();
      assert.equal(body.migrated, true);
      assert.equal(body.source_tier, "fast");
      const n = rt.tiers.get("fast")!.model.tokenizer.encode(prompt).length;
      const repair = rt.migrator.gate(rt.tiers.get("fast")!, rt.tiers.get("powerful")!);
      assert.ok(repair.ok);
      assert.equal(body.reused_tokens, n - 1 - repair.repairTokens);
      assert.ok(body.usage.completion_tokens >= 1);
    } finally {
      await rt.close();
    }
  },
});

Deno.test("POST /v1/decode with a snapshot key: 401 for unsigned or wrongly signed, 200 when signed", async () => {
  const signed = await testRuntime({ env: { KVRELAY_SNAPSHOT_KEY: "0123456789abcdef-key-one" } });
  const other = await testRuntime({ env: { KVRELAY_SNAPSHOT_KEY: "another-key-0123456789" } });
  const plain = await testRuntime();
  try {
    const app = createDecodeApp(signed);
    for (const [rt, want] of [[plain, 401], [other, 401], [signed, 200]] as const) {
      const res = await app.request("/v1/decode?tier=fast&max_tokens=2", {
        method: "POST",
        headers: SNAP,
        body: await snapshotOf(rt),
      });
      assert.equal(res.status, want);
      const body = await res.json();
      if (want === 401) assert.equal(body.error.type, "authentication_error");
    }
  } finally {
    await signed.close();
    await other.close();
    await plain.close();
  }
});

Deno.test("POST /v1/decode answers 400 for corrupt snapshots and 413 for oversized ones", async () => {
  const rt = await testRuntime({
    config: { server: { max_body_bytes: 8192, max_snapshot_bytes: 4096 } },
  });
  try {
    const app = createDecodeApp(rt);
    const snap = await snapshotOf(rt);
    assert.ok(snap.length > 4096, `snapshot is ${snap.length} bytes`);
    const big = await app.request("/v1/decode", { method: "POST", headers: SNAP, body: snap });
    assert.equal(big.status, 413);
    const bigStreamed = await app.request("/v1/decode?tier=fast", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(bigStreamed.status, 413);
    const corrupt = snap.slice(0, 2000);
    corrupt[40] ^= 0xff;
    const bad = await app.request("/v1/decode", { method: "POST", headers: SNAP, body: corrupt });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.type, "invalid_snapshot_error");
    const empty = await app.request("/v1/decode", {
      method: "POST",
      headers: SNAP,
      body: new Uint8Array(0),
    });
    assert.equal(empty.status, 400);
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/decode answers 400 context_length_exceeded naming continuation when it overflows max_context", async () => {
  const rt = await testRuntime(); // max_context 512
  try {
    const app = createDecodeApp(rt);
    const snap = await snapshotOf(rt);
    const res = await app.request(
      `/v1/decode?max_tokens=4&continuation=${encodeURIComponent(" x".repeat(600))}`,
      { method: "POST", headers: SNAP, body: snap },
    );
    assert.equal(res.status, 400);
    const body = await res.json();
    assert.equal(body.error.type, "context_length_exceeded");
    assert.equal(body.error.param, "continuation");
    const over = await app.request("/v1/decode?max_tokens=128&continuation=x", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(over.status, 200, "snapshot + continuation + max_tokens within max_context");
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/decode errors name the field: body or snapshot_id for bad snapshots, tier for a refused migration", async () => {
  const rt = await testRuntime({ tiers: { fast: "tiny-fast", balanced: "tiny-balanced" } });
  try {
    const app = createDecodeApp(rt);
    const snap = await snapshotOf(rt);
    const corrupt = snap.slice(0, 2000);
    corrupt[40] ^= 0xff;
    const bad = await app.request("/v1/decode", { method: "POST", headers: SNAP, body: corrupt });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.param, "body");
    const id = crypto.randomUUID();
    await rt.store.put(await snapshotKey("anonymous", id), corrupt);
    const stored = await app.request("/v1/decode", post({ snapshot_id: id }));
    assert.equal(stored.status, 400);
    const storedBody = await stored.json();
    assert.equal(storedBody.error.type, "invalid_snapshot_error");
    assert.equal(storedBody.error.param, "snapshot_id");
    const cross = await app.request("/v1/decode?tier=balanced", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(cross.status, 422);
    assert.equal((await cross.json()).error.param, "tier");
    const num = await app.request("/v1/decode?temperature=1e308", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(num.status, 400);
    const numBody = await num.json();
    assert.equal(numBody.error.param, "temperature");
    assert.match(numBody.error.message, /decimal number/);
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/decode cuts a stalled snapshot body at the body deadline: 408, budget and slot free", async () => {
  const rt = await testRuntime({
    tier: { concurrency: 1 },
    config: { server: { max_body_bytes: 8192, max_snapshot_bytes: 1 << 20, body_timeout_ms: 300 } },
  });
  try {
    const app = createDecodeApp(rt);
    const snap = await snapshotOf(rt);
    let cancelled = false;
    const stalled = new ReadableStream<Uint8Array>({
      start(ctl) {
        ctl.enqueue(snap.slice(0, 1000)); // the header and part of chunk 0, then nothing
      },
      cancel() {
        cancelled = true;
      },
    });
    let timer: ReturnType<typeof setTimeout> | undefined;
    const res = await Promise.race([
      app.request("/v1/decode?max_tokens=2", { method: "POST", headers: SNAP, body: stalled }),
      new Promise<null>((r) => timer = setTimeout(() => r(null), 3000)),
    ]);
    clearTimeout(timer);
    assert.ok(res, "no answer 3 s after a 300 ms deadline");
    assert.equal(res.status, 408);
    const err = (await res.json()).error;
    assert.equal(err.type, "timeout_error");
    assert.equal(err.param, "body");
    assert.ok(cancelled, "the request body was cancelled");
    const metrics = await (await app.request("/metrics")).text();
    assert.equal(metricValue(metrics, 'kvrelay_active_sequences{tier="fast"}'), 0);
    assert.equal(metricValue(metrics, "kvrelay_inflight_body_bytes"), 0);
    const next = await app.request("/v1/decode?max_tokens=2", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(next.status, 200, "the slot was released");
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/decode answers 400 naming body, not 500, when the snapshot upload breaks off", async () => {
  const rt = await testRuntime();
  try {
    const app = createDecodeApp(rt);
    const snap = await snapshotOf(rt);
    const broken = new ReadableStream<Uint8Array>({
      start(ctl) {
        ctl.enqueue(snap.slice(0, 1000));
      },
      pull(ctl) {
        ctl.error(new Error("connection reset by peer"));
      },
    });
    const res = await app.request("/v1/decode", { method: "POST", headers: SNAP, body: broken });
    assert.equal(res.status, 400);
    const body = await res.json();
    assert.equal(body.error.type, "invalid_request_error");
    assert.equal(body.error.param, "body");
    const metrics = await (await app.request("/metrics")).text();
    assert.equal(metricValue(metrics, 'kvrelay_active_sequences{tier="fast"}'), 0);
  } finally {
    await rt.close();
  }
});

Deno.test("POST /v1/decode stream stopped by shutdown ends with an unavailable_error frame, not timeout_error", async () => {
  const rt = await testRuntime();
  try {
    const snap = await snapshotOf(rt);
    const res = await createDecodeApp(rt).request("/v1/decode?max_tokens=100&stream=true", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(res.status, 200);
    const reader = res.body!.getReader();
    await reader.read(); // the first token's frame
    rt.abortInFlight();
    let text = "";
    const dec = new TextDecoder();
    for (let r = await reader.read(); !r.done; r = await reader.read()) text += dec.decode(r.value);
    const frames = text.split("\n\n").filter((f) => f.startsWith("data: ")).map((f) => f.slice(6));
    assert.equal(frames.at(-1), "[DONE]");
    const last = JSON.parse(frames.at(-2)!);
    assert.equal(last.error.type, "unavailable_error");
    assert.match(last.error.message, /shutting down/);
  } finally {
    await rt.close();
  }
});
