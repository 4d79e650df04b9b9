// Hostile-client measurements (not a test; prints JSON): /healthz latency
// percentiles while four ~1 MB prompts (refused unread) and four prompts just under the character
// bound (tokenized on the worker) arrive at once; the server's RSS idle, during and after three
// concurrent 250 MiB hostile snapshot uploads (random bytes, and a valid header + garbage); and
// stalled uploads answered by the body deadline; then the hostile bodies of hostile_bodies.ts
// (unread downloads, stalled snapshot headers at 40 and 80 clients and stalled JSON bodies against
// the body budget, deeply nested JSON); idle connections past the connection cap and stalled
// request heads (each answered or closed as designed, the process alive after). Starts
// functions/main.ts with the bundled tiers.
// Run: deno run -A bench/hostile.ts [--stderr] [--bodies]   (--stderr: print the server's log at
// the end; --bodies: only the hostile-body cases)
import { decodeHeader } from "../lib/snapshot/mod.ts";
import { startServer, writeConfig } from "../tests/e2e_support.ts";
import { hostileBodies } from "./hostile_bodies.ts";

/** The connection cap of the server under test (server.max_connections). */
const CAP = 256;
const BUDGET = 256 << 20;
const BODY_TIMEOUT_MS = 3000;
const DEADLINE_MS = 5000;
const CONCURRENCY = 4;
const cfg = await writeConfig(
  { fast: "tiny-fast", powerful: "tiny-powerful" },
  { max_context: 2048, concurrency: CONCURRENCY, request_timeout_ms: DEADLINE_MS },
  {
    server: {
      max_body_bytes: 2 << 20,
      body_timeout_ms: BODY_TIMEOUT_MS,
      max_snapshot_bytes: 256 << 20,
      max_inflight_upload_bytes: BUDGET,
      max_connections: CAP,
      idle_timeout_ms: 2000,
      head_timeout_ms: 1000,
    },
  },
);
const onlyBodies = Deno.args.includes("--bodies");
const server = await startServer("functions/main.ts", { KVRELAY_CONFIG: cfg });
const pid = server.child.pid;
const rssMiB = async () => {
  const s = await Deno.readTextFile(`/proc/${pid}/status`);
  return Number(/VmRSS:\s+(\d+)/.exec(s)![1]) / 1024;
};
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
};

/** Runs `rounds` bursts of four POSTs of `prompt` from a worker (so the client's own JSON work
 *  does not delay this thread's probes) while probing /healthz every 10 ms from here. */
async function healthzDuring(prompt: string, rounds: number) {
  const code = `self.onmessage = async (e) => {
    const { base, prompt, rounds } = e.data;
    const body = JSON.stringify({ model: "fast", prompt, max_tokens: 1 });
    const statuses = {};
    for (let r = 0; r < rounds; r++) {
      const res = await Promise.all([0, 1, 2, 3].map(() => fetch(base + "/v1/completions", {
        method: "POST", headers: { "content-type": "application/json" }, body,
      }).then(async (x) => { await x.arrayBuffer(); return x.status; })));
      for (const s of res) statuses[s] = (statuses[s] ?? 0) + 1;
    }
    self.postMessage(statuses);
  };`;
  const url = URL.createObjectURL(new Blob([code], { type: "application/javascript" }));
  const worker = new Worker(url, { type: "module" });
  const lat: number[] = [];
  let running = true;
  const probe = (async () => {
    while (running) {
      const t0 = performance.now();
      await (await fetch(`${server.base}/healthz`)).arrayBuffer();
      lat.push(performance.now() - t0);
      await new Promise((r) => setTimeout(r, 10));
    }
  })();
  const t0 = performance.now();
  const statuses = await new Promise((resolve) => {
    worker.onmessage = (e) => resolve(e.data);
    worker.postMessage({ base: server.base, prompt, rounds });
  });
  const workMs = performance.now() - t0;
  worker.terminate();
  running = false;
  await probe;
  return {
    statuses,
    n: lat.length,
    p50: pct(lat, 0.5),
    p99: pct(lat, 0.99),
    max: pct(lat, 1),
    workMs,
  };
}

const out: Record<string, unknown> = {
  cpu: (await Deno.readTextFile("/proc/cpuinfo")).match(/model name\s*:\s*(.*)/)?.[1],
};
try {
  if (!onlyBodies) await classic();
  const snap = new Uint8Array(
    await (await fetch(`${server.base}/v1/prefill`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ tier: "fast", prompt: "x ".repeat(60) }),
    })).arrayBuffer(),
  );
  out.hostile_bodies = await hostileBodies({
    base: server.base,
    port: server.port,
    rssMiB,
    budgetBytes: BUDGET,
    bodyTimeoutMs: BODY_TIMEOUT_MS,
    deadlineMs: DEADLINE_MS,
    concurrency: CONCURRENCY,
  }, snap);
  if (!onlyBodies) await connections();
} finally {
  const { stderr } = await server.stop();
  if (Deno.args.includes("--stderr")) console.error(stderr);
}
console.log(JSON.stringify(out, null, 2));

/** The first cases: probes under big prompts, hostile 250 MiB uploads, stalled bodies. */
async function classic() {
  const mb = "All work and no play makes Jack a dull boy. ".repeat(23832); // 1 MiB
  out.healthz_four_1MiB_prompts_ms = await healthzDuring(mb, 100);
  const under = "The quick brown fox jumps over the lazy dog. ".repeat(2900); // 130 KB
  out.healthz_four_130KB_prompts_tokenized_ms = await healthzDuring(under, 10);

  const idle = await rssMiB();
  const upload = (body: ReadableStream<Uint8Array>) =>
    fetch(`${server.base}/v1/migrate?target=fast`, {
      method: "POST",
      headers: { "content-type": "application/vnd.kvrelay.snapshot" },
      body,
    }).then(async (r) => ({ status: r.status, body: (await r.text()).slice(0, 120) }))
      .catch((e) => ({ status: 0, body: String(e) }));
  const hostile = (first: Uint8Array | null) => {
    const piece = new Uint8Array(1 << 20);
    for (let o = 0; o < piece.length; o += 65536) {
      crypto.getRandomValues(piece.subarray(o, o + 65536));
    }
    let sent = 0;
    return new ReadableStream<Uint8Array>({
      pull(ctl) {
        if (sent === 0 && first) ctl.enqueue(first);
        else if (sent >= 250) return ctl.close();
        else ctl.enqueue(piece);
        sent++;
      },
    });
  };
  let peak = idle;
  const sampler = setInterval(async () => peak = Math.max(peak, await rssMiB()), 50);
  const random = await Promise.all([0, 1, 2].map(() => upload(hostile(null))));
  // A real snapshot's prefix and header, then garbage: refused at the first chunk's CRC.
  const snap = new Uint8Array(
    await (await fetch(`${server.base}/v1/prefill`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ tier: "fast", prompt: "x ".repeat(600) }),
    })).arrayBuffer(),
  );
  const headerEnd = decodeHeader(snap).layout.payloadStart;
  const garbage = await Promise.all([0, 1, 2].map(() => upload(hostile(snap.slice(0, headerEnd)))));
  clearInterval(sampler);
  await new Promise((r) => setTimeout(r, 500));
  out.rss_mib = { idle, peak_during_six_250MiB_hostile_uploads: peak, after: await rssMiB() };
  out.hostile_upload_answers = { random, header_then_garbage: garbage };

  // Stalled bodies: answered by the 3 s body deadline.
  const stalled = async (path: string, type: string, bytes: Uint8Array) => {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.port });
    const head = `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: ${type}\r\n` +
      `Content-Length: ${bytes.length + 1}\r\n\r\n`;
    await conn.write(new TextEncoder().encode(head));
    await conn.write(bytes);
    const t0 = performance.now();
    const buf = new Uint8Array(512);
    const n = await conn.read(buf);
    const ms = performance.now() - t0;
    conn.close();
    return {
      path,
      ms: Math.round(ms),
      status: new TextDecoder().decode(buf.subarray(0, n ?? 0)).split("\r\n")[0],
    };
  };
  const S = "application/vnd.kvrelay.snapshot";
  out.stalled = await Promise.all([
    stalled("/v1/migrate?target=fast", S, snap.slice(0, 20)),
    stalled("/v1/migrate?target=fast", S, snap.slice(0, -1)),
    stalled("/v1/decode", S, snap.slice(0, 20)),
    stalled("/v1/chat/completions", "application/json", new TextEncoder().encode('{"mess')),
  ]);
}

/** Idle connections up to the cap and beyond it, then stalled heads. */
async function connections() {
  // Idle connections up to the cap and 64 beyond it, then 64 stalled heads: every one must be
  // closed by the idle timeout (no bytes), refused (503) or timed out (408); the process lives.
  const outcome = async (conn: Deno.Conn) => {
    const buf = new Uint8Array(1024);
    let text = "";
    try {
      for (let n = await conn.read(buf); n !== null; n = await conn.read(buf)) {
        text += new TextDecoder().decode(buf.subarray(0, n));
      }
    } catch {
      return "reset";
    } finally {
      conn.close();
    }
    return text === "" ? "closed" : text.split("\r\n")[0];
  };
  const connect = () => Deno.connect({ hostname: "127.0.0.1", port: server.port });
  const idleConns = [];
  for (let i = 0; i < CAP + 64; i++) idleConns.push(await connect());
  const t0 = performance.now();
  const idleOutcomes = await Promise.all(idleConns.map(outcome));
  const idleMs = performance.now() - t0;
  const stalledHeads = [];
  for (let i = 0; i < 64; i++) {
    const c = await connect();
    await c.write(new TextEncoder().encode("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));
    stalledHeads.push(c);
  }
  const headOutcomes = await Promise.all(stalledHeads.map(outcome));
  const tally = (xs: string[]) => {
    const t: Record<string, number> = {};
    for (const x of xs) t[x] = (t[x] ?? 0) + 1;
    return t;
  };
  const health = await fetch(`${server.base}/healthz`);
  await health.body?.cancel();
  const metrics = await (await fetch(`${server.base}/metrics`)).text();
  out.connections = {
    cap: CAP,
    idle_connections_opened: idleConns.length,
    idle_outcomes: tally(idleOutcomes),
    idle_all_ended_ms: Math.round(idleMs),
    stalled_head_outcomes: tally(headOutcomes),
    healthz_after: health.status,
    process_alive: await Promise.race([
      server.child.status.then(() => false),
      new Promise<boolean>((r) => setTimeout(() => r(true), 100)),
    ]),
    metrics: metrics.split("\n").filter((l) =>
      /^kvrelay_(open_connections|connections_|accept_errors)/.test(l)
    ),
  };
}
