// Hostile-upload tests across routes via app.request(): stalled bodies (before the snapshot header
// is complete, all but the last byte, JSON) are answered at the body deadline; a slow upload holds
// no tier slot; a body that is not a snapshot is refused at its first bytes; the per-process body
// budget charges the bytes received (a stalled header from its first byte, JSON too), not declared
// sizes, and answers 429 when full; a declared size above max_snapshot_bytes is a 413; a body read
// ends at the tier's request deadline when that comes first.
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
import { PREFIX_BYTES } from "../../lib/snapshot/mod.ts";

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
    assert.equal(metricValue(metrics, "kvrelay_inflight_body_bytes"), 0);
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

/** Starts a stalled request on `app`; `stop()` aborts it (the client goes away). */
function stalledRequest(
  app: ReturnType<typeof allApp>,
  url: string,
  headers: Record<string, string>,
  bytes: Uint8Array,
) {
  const s = stalled(bytes);
  const ac = new AbortController();
  const res = app.request(url, {
    method: "POST",
    headers,
    body: s.stream,
    signal: ac.signal,
  }) as Promise<Response>;
  res.catch(() => {});
  return { ...s, res, stop: () => ac.abort() };
}

async function bodyBytesHeld(app: ReturnType<typeof allApp>): Promise<number> {
  return metricValue(await (await app.request("/metrics")).text(), "kvrelay_inflight_body_bytes");
}

const settle = () => new Promise((r) => setTimeout(r, 100));

Deno.test("the body budget charges bytes actually held: stalled uploads that declare large snapshots do not refuse an honest one", async () => {
  const rt0 = await testRuntime();
  const snap = await snapshotOf(rt0);
  await rt0.close();
  // Room for one whole snapshot and a little more: under the old rule (declared sizes reserved
  // at the header) the two stalled uploads below would hold two snapshots' worth.
  const rt = await testRuntime({
    config: server({
      body_timeout_ms: 20000,
      max_inflight_upload_bytes: snap.length + 4000,
    }),
  });
  try {
    const app = allApp(rt);
    const held = [
      stalledRequest(app, "/v1/migrate?target=fast", SNAP, snap.slice(0, 1000)),
      stalledRequest(app, "/v1/decode", SNAP, snap.slice(0, 1000)),
      stalledRequest(
        app,
        "/v1/chat/completions",
        { "content-type": "application/json" },
        new TextEncoder().encode('{"messages": [{"role": "user", "content": "' + "x".repeat(457)),
      ),
    ];
    await settle();
    assert.equal(await bodyBytesHeld(app), 2500, "the bytes received so far, JSON included");
    const ok = await app.request("/v1/migrate?target=fast", {
      method: "POST",
      headers: SNAP,
      body: snap,
    });
    assert.equal(ok.status, 200, "an honest upload fits beside what the stalled ones sent");
    await ok.arrayBuffer();
    for (const h of held) h.stop();
    await Promise.allSettled(held.map((h) => h.res));
    await settle();
    assert.equal(await bodyBytesHeld(app), 0, "released however the request ended");
  } finally {
    await rt.close();
  }
});

Deno.test("a stalled snapshot header is charged from its first byte; over the budget → 429 naming it", async () => {
  const rt0 = await testRuntime();
  const snap = await snapshotOf(rt0);
  await rt0.close();
  // A valid prefix declaring a 1 MiB header, then 40,000 bytes of it and a stall.
  const head = new Uint8Array(PREFIX_BYTES + 40_000);
  head.set(snap.subarray(0, PREFIX_BYTES));
  new DataView(head.buffer).setUint32(16, 1 << 20, true);
  const rt = await testRuntime({
    config: server({
      body_timeout_ms: 20000,
      max_snapshot_bytes: 8 << 20,
      max_inflight_upload_bytes: 64 * 1024,
    }),
  });
  try {
    const app = allApp(rt);
    const first = stalledRequest(app, "/v1/decode", SNAP, head);
    await settle();
    assert.equal(await bodyBytesHeld(app), head.length, "the header's bytes are held");
    const second = stalledRequest(app, "/v1/migrate?target=fast", SNAP, head);
    const res = await within(3000, second.res);
    assert.equal(res.status, 429);
    const err = (await res.json()).error;
    assert.equal(err.type, "rate_limit_error");
    assert.match(err.message, /server\.max_inflight_upload_bytes/);
    assert.ok(Number(res.headers.get("retry-after")) >= 1);
    assert.ok(second.state.cancelled, "the refused body was cancelled");
    first.stop();
    await Promise.allSettled([first.res]);
    await settle();
    assert.equal(await bodyBytesHeld(app), 0);
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

Deno.test("a body read ends at the tier's request deadline when it comes before server.body_timeout_ms", async () => {
  const rt = await testRuntime({
    tier: { request_timeout_ms: 300 },
    config: server({ body_timeout_ms: 20000 }),
  });
  try {
    const snap = await snapshotOf(rt);
    const app = allApp(rt);
    const cases: [string, string, Record<string, string>, Uint8Array, RegExp][] = [
      [
        "decode ?tier=fast",
        "/v1/decode?tier=fast",
        SNAP,
        snap.slice(0, 1000),
        /tier "fast"'s request_timeout_ms/,
      ],
      [
        "migrate ?target=fast",
        "/v1/migrate?target=fast",
        SNAP,
        snap.slice(0, 1000),
        /tier "fast"'s request_timeout_ms/,
      ],
      [
        "JSON (the tier is in the body)",
        "/v1/chat/completions",
        { "content-type": "application/json" },
        new TextEncoder().encode('{"mess'),
        /longest request_timeout_ms/,
      ],
    ];
    for (const [what, url, headers, bytes, why] of cases) {
      const s = stalledRequest(app, url, headers, bytes);
      const res = await within(5000, s.res);
      assert.equal(res.status, 408, what);
      const err = (await res.json()).error;
      assert.equal(err.type, "timeout_error", what);
      assert.equal(err.param, "body", what);
      assert.match(err.message, /within 300 ms/, what);
      assert.match(err.message, why, what);
    }
  } finally {
    await rt.close();
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
