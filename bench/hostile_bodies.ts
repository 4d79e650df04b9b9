// Hostile request and response bodies against a running server (bench/hostile.ts starts it):
// clients that never read a snapshot download (prefill and migrate, the tier's whole concurrency),
// stalled snapshot headers (a prefix declaring a 24 MiB header, 24 MiB − 1 bytes of it, then
// nothing) at 40 and 80 clients, stalled 1 MiB JSON bodies, and JSON nested 5,000 deep. Reports
// the server's RSS against the body budget, the held-bytes gauge, how long the tier's sequences
// stay taken, and every answer's status — each hostile request must get a 4xx/503 with a JSON
// body, none may crash the server or go unanswered past its deadline.
import { PREFIX_BYTES } from "../lib/snapshot/mod.ts";

/** The server under test and its limits. */
export interface BodiesTarget {
  base: string;
  port: number;
  rssMiB(): Promise<number>;
  /** server.max_inflight_upload_bytes */
  budgetBytes: number;
  /** server.body_timeout_ms */
  bodyTimeoutMs: number;
  /** the tiers' request_timeout_ms */
  deadlineMs: number;
  /** the tiers' concurrency */
  concurrency: number;
}

const enc = new TextEncoder();

/** Writes all of `bytes` (one write may take only part of them). */
async function writeAll(conn: Deno.Conn, bytes: Uint8Array) {
  for (let o = 0; o < bytes.length;) o += await conn.write(bytes.subarray(o));
}

async function metric(base: string, series: string): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  for (const line of text.split("\n")) {
    if (line.startsWith(series + " ")) return Number(line.slice(series.length + 1));
  }
  return 0;
}

/** An answer as a raw client saw it. */
interface Answer {
  status: number;
  /** The body parsed as JSON with an `error` object. */
  jsonError: boolean;
  ms: number;
}

/** Reads one HTTP/1.1 response (head + content-length body) from `conn`. */
async function readAnswer(conn: Deno.Conn, t0: number): Promise<Answer> {
  let buf = new Uint8Array(0);
  const chunk = new Uint8Array(64 * 1024);
  const more = async () => {
    const n = await conn.read(chunk);
    if (n === null) throw new Error("connection closed before the answer");
    const b = new Uint8Array(buf.length + n);
    b.set(buf);
    b.set(chunk.subarray(0, n), buf.length);
    buf = b;
  };
  let end = -1;
  while ((end = new TextDecoder().decode(buf).indexOf("\r\n\r\n")) < 0) await more();
  const head = new TextDecoder().decode(buf.subarray(0, end));
  const status = Number(head.split(" ")[1]);
  const ms = performance.now() - t0;
  const len = Number(/content-length:\s*(\d+)/i.exec(head)?.[1] ?? "-1");
  let jsonError = false;
  if (len >= 0) {
    while (buf.length < end + 4 + len) await more();
    try {
      jsonError = typeof JSON.parse(new TextDecoder().decode(buf.subarray(end + 4, end + 4 + len)))
        .error === "object";
    } catch {
      jsonError = false;
    }
  }
  return { status, jsonError, ms };
}

/**
 * A client that sends a request head and `bytes` of body (of a declared `length`), then stalls,
 * and waits for the answer (at most `capMs`: past it the request counts as a hang).
 */
async function stalledClient(
  port: number,
  path: string,
  type: string,
  length: number,
  first: Uint8Array,
  fill: number,
  capMs: number,
): Promise<Answer | "hang" | "error"> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const t0 = performance.now();
  let answered = false;
  const writer = (async () => {
    await conn.write(
      enc.encode(
        `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: ${type}\r\nContent-Length: ${length}\r\n\r\n`,
      ),
    );
    await writeAll(conn, first);
    const piece = new Uint8Array(64 * 1024);
    for (let sent = 0; sent < fill && !answered;) {
      const n = Math.min(piece.length, fill - sent);
      sent += await conn.write(piece.subarray(0, n));
    }
  })().catch(() => {});
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const r = await Promise.race([
      readAnswer(conn, t0),
      new Promise<"hang">((res) => timer = setTimeout(() => res("hang"), capMs)),
    ]);
    return r;
  } catch {
    return "error";
  } finally {
    answered = true;
    clearTimeout(timer);
    try {
      conn.close();
    } catch {
      // closed by the server
    }
    await writer;
  }
}

function tally(answers: (Answer | "hang" | "error")[], limitMs: number) {
  const statuses: Record<string, number> = {};
  let notJson = 0, hangs = 0, late = 0, maxMs = 0;
  for (const a of answers) {
    if (a === "hang" || a === "error") {
      statuses[a] = (statuses[a] ?? 0) + 1;
      if (a === "hang") hangs++;
      continue;
    }
    statuses[a.status] = (statuses[a.status] ?? 0) + 1;
    if (!a.jsonError) notJson++;
    if (a.ms > limitMs) late++;
    maxMs = Math.max(maxMs, a.ms);
  }
  return {
    statuses,
    not_json: notJson,
    hangs,
    answered_past_deadline: late,
    max_ms: Math.round(maxMs),
  };
}

/** Samples RSS and the held-bytes gauge every 50 ms until stopped; returns the peaks. */
function sampler(t: BodiesTarget) {
  let rss = 0, held = 0, running = true;
  const loop = (async () => {
    while (running) {
      rss = Math.max(rss, await t.rssMiB());
      held = Math.max(held, await metric(t.base, "kvrelay_inflight_body_bytes"));
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  return async () => {
    running = false;
    await loop;
    return { peak_rss_mib: Math.round(rss), peak_held_mib: Math.round(held / (1 << 20)) };
  };
}

async function waitIdle(t: BodiesTarget) {
  for (let i = 0; i < 200; i++) {
    if ((await metric(t.base, "kvrelay_inflight_body_bytes")) === 0) return;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Stalled snapshot headers: a valid prefix declaring a 24 MiB header, 24 MiB − 1 of it. */
async function stalledHeaders(t: BodiesTarget, clients: number, prefix: Uint8Array) {
  await waitIdle(t);
  const idle = await t.rssMiB();
  const stop = sampler(t);
  const headerBytes = 24 << 20;
  const first = prefix.slice(0, PREFIX_BYTES);
  new DataView(first.buffer).setUint32(16, headerBytes, true);
  const answers = await Promise.all(
    Array.from({ length: clients }, (_, i) =>
      stalledClient(
        t.port,
        i % 2 === 0 ? "/v1/decode" : "/v1/migrate?target=fast",
        "application/vnd.kvrelay.snapshot",
        PREFIX_BYTES + headerBytes + 1024,
        first,
        headerBytes - 1,
        t.bodyTimeoutMs + 10_000,
      )),
  );
  const peaks = await stop();
  await waitIdle(t);
  return {
    clients,
    idle_rss_mib: Math.round(idle),
    ...peaks,
    budget_mib: t.budgetBytes / (1 << 20),
    growth_mib: Math.round(peaks.peak_rss_mib - idle),
    growth_within_budget_plus_100_mib: peaks.peak_rss_mib - idle <= t.budgetBytes / (1 << 20) + 100,
    after_rss_mib: Math.round(await t.rssMiB()),
    held_after: await metric(t.base, "kvrelay_inflight_body_bytes"),
    answers: tally(answers, t.bodyTimeoutMs + 2000),
  };
}

/** Stalled JSON bodies of 1 MiB − 1 bytes (declared 1 MiB). */
async function stalledJson(t: BodiesTarget, clients: number) {
  await waitIdle(t);
  const idle = await t.rssMiB();
  const stop = sampler(t);
  const first = enc.encode('{"messages": [{"role": "user", "content": "');
  const answers = await Promise.all(
    Array.from({ length: clients }, () =>
      stalledClient(
        t.port,
        "/v1/chat/completions",
        "application/json",
        1 << 20,
        first,
        (1 << 20) - 1 - first.length,
        t.bodyTimeoutMs + 10_000,
      )),
  );
  const peaks = await stop();
  await waitIdle(t);
  return {
    clients,
    idle_rss_mib: Math.round(idle),
    ...peaks,
    budget_mib: t.budgetBytes / (1 << 20),
    growth_mib: Math.round(peaks.peak_rss_mib - idle),
    answers: tally(answers, t.bodyTimeoutMs + 2000),
  };
}

/** Opens a request whose answer is read only up to its head, never further. */
async function unreadDownload(t: BodiesTarget, path: string, type: string, body: Uint8Array) {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: t.port });
  await conn.write(
    enc.encode(
      `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: ${type}\r\nContent-Length: ${body.length}\r\n\r\n`,
    ),
  );
  await writeAll(conn, body);
  const head = new Uint8Array(4096);
  const n = await conn.read(head);
  return { conn, status: new TextDecoder().decode(head.subarray(0, n ?? 0)).split(" ")[1] };
}

/** The tier's whole concurrency in downloads nobody reads (prefill, and one migrate). */
async function unreadDownloads(t: BodiesTarget) {
  const tokens = Array.from({ length: 1500 }, (_, i) => 5 + (i % 200));
  const snap = new Uint8Array(
    await (await fetch(`${t.base}/v1/prefill`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ tier: "powerful", tokens }),
    })).arrayBuffer(),
  );
  const active = () => metric(t.base, 'kvrelay_active_sequences{tier="powerful"}');
  const t0 = performance.now();
  // The migrate first (its 12 MB upload must arrive within the body deadline), then the prefills.
  const opened = [
    await unreadDownload(
      t,
      "/v1/migrate?target=powerful",
      "application/vnd.kvrelay.snapshot",
      snap,
    ),
  ];
  opened.push(
    ...await Promise.all(
      Array.from({ length: t.concurrency - 1 }, (_, i) =>
        unreadDownload(
          t,
          "/v1/prefill",
          "application/json",
          enc.encode(JSON.stringify({ tier: "powerful", tokens: tokens.map((x) => x + i + 1) })),
        )),
    ),
  );
  const heldAtStart = await active();
  let idleAfterMs = -1;
  while (performance.now() - t0 < t.deadlineMs + 10_000) {
    if ((await active()) === 0) {
      idleAfterMs = Math.round(performance.now() - t0);
      break;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  const chat = await fetch(`${t.base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "powerful",
      messages: [{ role: "user", content: "hello" }],
      max_tokens: 2,
    }),
  });
  await chat.arrayBuffer();
  for (const o of opened) {
    try {
      o.conn.close();
    } catch {
      // cut by the server
    }
  }
  return {
    downloads: opened.length,
    snapshot_bytes: snap.length,
    statuses: opened.map((o) => o.status),
    active_sequences_while_unread: heldAtStart,
    active_sequences_zero_after_ms: idleAfterMs,
    deadline_ms: t.deadlineMs,
    write_timeouts: await metric(t.base, 'kvrelay_write_timeouts_total{body="snapshot"}'),
    chat_on_the_tier_after: chat.status,
  };
}

/** JSON nested 5,000 deep on every POST route. */
async function deepJson(t: BodiesTarget) {
  const d = 5000;
  const out: Record<string, number> = {};
  for (
    const path of [
      "/v1/generate",
      "/v1/completions",
      "/v1/chat/completions",
      "/v1/prefill",
      "/v1/migrate",
      "/v1/decode",
    ]
  ) {
    for (
      const [shape, body] of [["arrays", "[".repeat(d) + "]".repeat(d)], [
        "objects",
        '{"a":'.repeat(d) + "1" + "}".repeat(d),
      ]]
    ) {
      const r = await fetch(`${t.base}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body,
      });
      const json = await r.json().catch(() => null);
      out[`${path} ${shape}`] = json?.error ? r.status : -r.status;
    }
  }
  return out;
}

/**
 * Runs every hostile-body case once against `t`.
 * @param t the server and its limits
 * @param prefix the first bytes of a real snapshot of the server (a valid prefix)
 * @returns the measurements
 */
export async function hostileBodies(t: BodiesTarget, prefix: Uint8Array) {
  return {
    rss_at_start_mib: Math.round(await t.rssMiB()),
    unread_downloads: await unreadDownloads(t),
    stalled_headers_40: await stalledHeaders(t, 40, prefix),
    stalled_headers_80: await stalledHeaders(t, 80, prefix),
    stalled_json_1MiB_300: await stalledJson(t, 300),
    deep_json_status: await deepJson(t),
    healthz_after: await fetch(`${t.base}/healthz`).then(async (r) => {
      await r.arrayBuffer();
      return r.status;
    }).catch(() => 0),
  };
}
