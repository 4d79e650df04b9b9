// Hostile-upload tests across routes via app.request(): stalled bodies (before the snapshot header
// is complete, all but the last byte, JSON) are answered at the body deadline; a slow upload holds
// no tier slot; a body that is not a snapshot is refused at its first bytes; the per-process
// in-flight upload bound answers 429, a declared size above max_snapshot_bytes 413.
import assert from "node:assert/strict";
import { createDecodeApp } from "../decode/app.ts";
import { createGenerateApp } from "../generate/app.ts";
import { createMigrateApp } from "../migrate/app.ts";
import { createPrefillApp } from "../prefill/app.ts";
import { createBaseApp } from "./app.ts";
import { metricValue, post, testRuntime } from "./test_helpers.ts";
import { registerDecode } from "../decode/app.ts";
import { registerGenerate } from "../generate/app.ts";
import { registerMigrate } from "../migrate/app.ts";
import type { Runtime } from "../../lib/serve/mod.ts";

const SNAP = { "content-type": "application/vnd.kvrelay.snapshot" };
const prompt = "The lighthouse keeper counted the ships that passed";

function server(body: Record<string, unknown> = {}) {
  return {
    server: { max_body_bytes: 8192, max_snapshot_bytes: 1 << 20, body_timeout_ms: 300, ...body },
  };
}

async function snapshotOf(rt: Runtime): Promise<Uint8Array<ArrayBuffer>> {
  const res = await createPrefillApp(rt).request("/v1/prefill", post({ tier: "fast", prompt }));
  assert.equal(res.status, 200);
  return new Uint8Array(await res.arrayBuffer());
}

/** A body that sends `bytes` and then nothing, ever; records whether it was cancelled and how
 *  many times it was pulled. */
function stalled(bytes: Uint8Array) {
  const state = { cancelled: false, pulls: 0 };
  const stream = new ReadableStream<Uint8Array>({
    start(ctl) {
      if (bytes.length > 0) ctl.enqueue(bytes);
    },
    pull() {
      state.pulls++;
      return new Promise(() => {}); // never resolves: a stalled sender
    },
    cancel() {
      state.cancelled = true;
    },
  });
  return { stream, state };
}

async function within(ms: number, p: Promise<Response>): Promise<Response> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const r = await Promise.race([
    p,
    new Promise<null>((res) => timer = setTimeout(() => res(null), ms)),
  ]);
  clearTimeout(timer);
  assert.ok(r, `no answer within ${ms} ms`);
  return r;
}

function allApp(rt: Runtime) {
  const app = createBaseApp(rt, "all");
  registerGenerate(app, rt);
  registerDecode(app, rt);
  registerMigrate(app, rt);
  return app;
}

Deno.test("stalled uploads on every route answer 408 timeout_error at the body deadline", async () => {
  const rt = await testRuntime({ config: server() });
  try {
    const snap = await snapshotOf(rt);
    const app = allApp(rt);
    const cases: [string, string, Record<string, string>, Uint8Array][] = [
      ["decode, header incomplete (20 bytes)", "/v1/decode?max_tokens=2", SNAP, snap.slice(0, 20)],
      ["migrate, 20 bytes", "/v1/migrate?target=fast", SNAP, snap.slice(0, 20)],
      ["migrate, all but the last byte", "/v1/migrate?target=fast", SNAP, snap.slice(0, -1)],
      ["decode, all but the last byte", "/v1/decode?max_tokens=2", SNAP, snap.slice(0, -1)],
      [
        "chat JSON, half a body",
        "/v1/chat/completions",
        { "content-type": "application/json" },
        new TextEncoder().encode('{"messages": [{"role": "user", "content": "hi'),
      ],
    ];
    for (const [what, url, headers, bytes] of cases) {
      const { stream, state } = stalled(bytes);
      const t0 = performance.now();
      const res = await within(
        3000,
        app.request(url, { method: "POST", headers, body: stream }) as Promise<Response>,
      );
      const ms = performance.now() - t0;
      assert.equal(res.status, 408, what);
      const err = (await res.json()).error;
      assert.equal(err.type, "timeout_error", what);
      assert.equal(err.param, "body", what);
      assert.ok(ms >= 250, `${what}: answered after ${ms} ms, before the deadline`);
      assert.ok(state.cancelled, `${what}: the body was cancelled`);
    }
    const metrics = await (await app.request("/metrics")).text();
    assert.equal(metricValue(metrics, "kvrelay_inflight_upload_bytes"), 0);
    assert.equal(metricValue(metrics, 'kvrelay_active_sequences{tier="fast"}'), 0);
  } finally {
    await rt.close();
  }
});

Deno.test("slow snapshot uploads hold no tier slot: a normal request on the tier is served meanwhile", async () => {
  const rt = await testRuntime({
    tier: { concurrency: 1, request_timeout_ms: 20000 },
    config: server({ body_timeout_ms: 20000 }),
  });
  try {
    const snap = await snapshotOf(rt);
    const app = allApp(rt);
    const uploads = [0, 1].map(() => {
      const s = stalled(snap.slice(0, 1000)); // header complete, then the sender stalls
      const ac = new AbortController();
      const res = app.request("/v1/decode?max_tokens=2", {
        method: "POST",
        headers: SNAP,
        body: s.stream,
        signal: ac.signal,
      }) as Promise<Response>;
      res.catch(() => {});
      return { ...s, ac, res };
    });
    await new Promise((r) => setTimeout(r, 100));
    const res = await within(
      5000,
      app.request(
        "/v1/completions",
        post({ model: "fast", prompt, max_tokens: 2 }),
      ) as Promise<Response>,
    );
    assert.equal(res.status, 200);
    for (const u of uploads) u.ac.abort();
    await Promise.allSettled(uploads.map((u) => u.res));
  } finally {
    await rt.close();
  }
});

Deno.test("a body that is not a snapshot is refused at its first bytes, not after it was buffered", async () => {
  const rt = await testRuntime({ config: server({ max_snapshot_bytes: 256 << 20 }) });
  try {
    const app = allApp(rt);
    for (const url of ["/v1/migrate?target=fast", "/v1/decode"]) {
      let pulls = 0;
      let cancelled = false;
      const piece = crypto.getRandomValues(new Uint8Array(64 * 1024));
      const random = new ReadableStream<Uint8Array>({
        pull(ctl) {
          pulls++;
          if (pulls > 3200) ctl.close(); // 200 MiB if it were all read
          else ctl.enqueue(piece);
        },
        cancel() {
          cancelled = true;
        },
      });
      const res = await app.request(url, { method: "POST", headers: SNAP, body: random });
      assert.equal(res.status, 400, url);
      const err = (await res.json()).error;
      assert.equal(err.type, "invalid_snapshot_error", url);
      assert.equal(err.param, "body", url);
      // A few pieces are read ahead by the pass-through stages (byte count, timing).
      assert.ok(pulls <= 8, `${url}: read ${pulls} pieces of 64 KiB before refusing`);
      assert.ok(cancelled, `${url}: the body was cancelled`);
    }
  } finally {
    await rt.close();
  }
});

Deno.test("uploads in flight are bounded per process: 429 over the bound, 413 over max_snapshot_bytes", async () => {
  const rt0 = await testRuntime();
  const snap = await snapshotOf(rt0);
  await rt0.close();
  const rt = await testRuntime({
    config: server({
      body_timeout_ms: 20000,
      max_inflight_upload_bytes: Math.floor(snap.length * 1.5),
    }),
  });
  try {
    const app = allApp(rt);
    const first = stalled(snap.slice(0, 1000));
    const ac = new AbortController();
    const held = app.request("/v1/migrate?target=fast", {
      method: "POST",
      headers: SNAP,
      body: first.stream,
      signal: ac.signal,
    }) as Promise<Response>;
    held.catch(() => {});
    await new Promise((r) => setTimeout(r, 100));
    let metrics = await (await app.request("/metrics")).text();
    assert.equal(metricValue(metrics, "kvrelay_inflight_upload_bytes"), snap.length);
    const res = await app.request("/v1/migrate?target=fast", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(res.status, 429);
    assert.equal((await res.json()).error.type, "rate_limit_error");
    assert.ok(Number(res.headers.get("retry-after")) >= 1);
    ac.abort();
    await Promise.allSettled([held]);
    await new Promise((r) => setTimeout(r, 50));
    metrics = await (await app.request("/metrics")).text();
    assert.equal(metricValue(metrics, "kvrelay_inflight_upload_bytes"), 0);
    const ok = await app.request("/v1/migrate?target=fast", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(ok.status, 200);
    await ok.arrayBuffer();
  } finally {
    await rt.close();
  }
  const small = await testRuntime({ config: server({ max_snapshot_bytes: 2048 }) });
  try {
    const { stream, state } = stalled(snap.slice(0, 1000));
    const res = await within(
      3000,
      createMigrateApp(small).request("/v1/migrate?target=fast", {
        method: "POST",
        headers: SNAP,
        body: stream,
      }) as Promise<Response>,
    );
    assert.equal(res.status, 413, "the header's declared size is over the bound");
    assert.ok(state.cancelled);
  } finally {
    await small.close();
  }
});

Deno.test("createDecodeApp and createGenerateApp answer a stalled JSON body with 408 too", async () => {
  const rt = await testRuntime({ config: server() });
  try {
    for (
      const [app, url] of [
        [createDecodeApp(rt), "/v1/decode"],
        [createGenerateApp(rt), "/v1/generate"],
      ] as const
    ) {
      const { stream } = stalled(new TextEncoder().encode('{"snapshot_id": "a'));
      const res = await within(
        3000,
        app.request(url, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: stream,
        }) as Promise<Response>,
      );
      assert.equal(res.status, 408, url);
    }
  } finally {
    await rt.close();
  }
});
