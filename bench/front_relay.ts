// What a front listener in front of Deno.serve would cost (docs/http.md "Headers"): the cheapest
// possible one — accept TCP, read the request head, answer a JSON 431 when it is over the limit,
// else relay the connection's bytes both ways to Deno.serve on a unix socket — against Deno.serve
// directly. Prints per-request latency of small keep-alive requests and the time of a 64 MiB
// upload, each way. A lower bound: a correct front layer would also parse every later request on a
// kept-alive connection (Content-Length, chunked), which this one does not.
// Usage: deno run -A bench/front_relay.ts
const LIMIT = 32 * 1024;
const sock = await Deno.makeTempFile({ suffix: ".sock" });
await Deno.remove(sock);
const handler = async (req: Request) => {
  if (req.method === "POST") {
    let n = 0;
    for await (const c of req.body!) n += c.length;
    return Response.json({ n });
  }
  return new Response("ok");
};
const direct = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, handler);
const inner = Deno.serve({ path: sock, onListen() {} }, handler);
const listener = Deno.listen({ port: 0, hostname: "127.0.0.1" });
const enc = new TextEncoder();
const tooLarge = (n: number) => {
  const body = JSON.stringify({
    error: { type: "invalid_request_error", message: `headers ${n} bytes`, param: "headers" },
  });
  return enc.encode(
    `HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n` +
      `content-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`,
  );
};
async function front(conn: Deno.Conn) {
  const buf = new Uint8Array(LIMIT + 4);
  let got = 0;
  const end = () => {
    for (let i = Math.max(0, got - 4); i + 3 < got; i++) {
      if (buf[i] === 13 && buf[i + 1] === 10 && buf[i + 2] === 13 && buf[i + 3] === 10) return true;
    }
    return false;
  };
  while (true) {
    const n = await conn.read(buf.subarray(got));
    if (n === null) return conn.close();
    got += n;
    if (end()) break;
    if (got >= buf.length) {
      await conn.write(tooLarge(got)).catch(() => {});
      return conn.close();
    }
  }
  const up = await Deno.connect({ transport: "unix", path: sock });
  await up.write(buf.subarray(0, got));
  await Promise.allSettled([conn.readable.pipeTo(up.writable), up.readable.pipeTo(conn.writable)]);
}
(async () => {
  for await (const c of listener) front(c).catch(() => {});
})();

const directUrl = `http://127.0.0.1:${direct.addr.port}`;
const frontUrl = `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`;
async function small(url: string, n: number) {
  const ms: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await (await fetch(`${url}/healthz`)).text();
    ms.push(performance.now() - t);
  }
  ms.sort((a, b) => a - b);
  const q = (p: number) => ms[Math.min(ms.length - 1, Math.floor(p * ms.length))].toFixed(3);
  const mean = (ms.reduce((a, b) => a + b, 0) / ms.length).toFixed(3);
  return `mean ${mean} p50 ${q(0.5)} p99 ${q(0.99)} ms`;
}
async function upload(url: string) {
  const body = new Uint8Array(64 << 20);
  const t = performance.now();
  const r = await (await fetch(`${url}/up`, { method: "POST", body })).json();
  if (r.n !== body.length) throw new Error("short upload");
  return `${(performance.now() - t).toFixed(0)} ms`;
}
for (const url of [directUrl, frontUrl]) {
  await small(url, 300);
}
for (let round = 0; round < 3; round++) {
  for (const [name, url] of [["direct", directUrl], ["front", frontUrl]] as const) {
    console.log(
      `round ${round} ${name.padEnd(6)} 2000 × GET: ${await small(
        url,
        2000,
      )}; 64 MiB POST: ${await upload(url)}`,
    );
  }
}
// On a fresh connection the front answers the JSON 431; on a kept-alive one (already relayed) the
// head goes to Deno.serve, which answers its empty 400: the gap a real front layer must close.
const fresh = Deno.createHttpClient({});
const headers = { "x-big": "a".repeat(100_000) };
const big = await fetch(`${frontUrl}/healthz`, { headers, client: fresh });
console.log("front, 100 KB header, new connection:", big.status, await big.text());
const kept = await fetch(`${frontUrl}/healthz`, { headers });
console.log("front, 100 KB header, kept-alive connection:", kept.status, await kept.text());
fresh.close();
listener.close();
await Promise.all([direct.shutdown(), inner.shutdown()]);
