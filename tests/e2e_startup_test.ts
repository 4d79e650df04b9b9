// End-to-end start-up refusals of a real process (functions/main.ts): a config naming a missing
// model folder or a KV pool too small for max_context, and a port already in use, each stop the
// process with exit status 2 before it listens, saying which field, which value and what works;
// a CPU-only start that serves requests logs no warnings (no legacy request-signal notice, one
// information line for `backend: auto`).

import assert from "node:assert/strict";
import { freePort, removeAtExit, startServer, writeConfig } from "./e2e_support.ts";

const root = new URL("../", import.meta.url).pathname;

async function start(env: Record<string, string>): Promise<{ code: number; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${root}functions/main.ts`],
    env: { HOST: "127.0.0.1", ...env },
    stdout: "null",
    stderr: "piped",
  }).output();
  return { code: out.code, stderr: new TextDecoder().decode(out.stderr) };
}

Deno.test("a missing model folder and a too-small kv_pool_mb stop the server before it listens (exit 2)", async () => {
  const dir = await Deno.makeTempDir({ prefix: "kvrelay-e2e-" });
  removeAtExit(dir);
  await Deno.writeTextFile(
    `${dir}/config.json`,
    JSON.stringify({
      tiers: {
        big: { model: "./no-such-model" },
        small: { model: `${root}models/tiny-powerful`, kv_pool_mb: 4, max_context: 2048 },
      },
    }),
  );
  const { code, stderr } = await start({
    KVRELAY_CONFIG: `${dir}/config.json`,
    PORT: String(freePort()),
  });
  assert.equal(code, 2, stderr);
  assert.doesNotMatch(stderr, /listening/);
  assert.match(stderr, new RegExp(`tiers\\.big\\.model: "${dir}/no-such-model" does not exist`));
  // tiny-powerful keeps 8 KiB of f32 K and V a token: 2048 tokens need 16 MiB.
  assert.match(stderr, /tiers\.small\.kv_pool_mb: 4 holds 32 blocks .* set it to at least 16\b/);
  assert.doesNotMatch(stderr, /^\s+at /m, "a stack trace");
});

Deno.test("a port in use stops the server with one line naming PORT (exit 2)", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  try {
    const { code, stderr } = await start({ PORT: String(port) });
    assert.equal(code, 2, stderr);
    const lines = stderr.trim().split("\n");
    assert.equal(lines.length, 1, stderr);
    assert.match(
      lines[0],
      new RegExp(`server\\.port: ${port} on 127\\.0\\.0\\.1 is in use: set PORT`),
    );
  } finally {
    listener.close();
  }
});

Deno.test("a CPU-only start serving requests logs one backend line and no request.signal warning", async () => {
  const server = await startServer("functions/main.ts", {
    KVRELAY_CONFIG: await writeConfig({ fast: "tiny-fast" }, { kv_pool_mb: 8 }),
  });
  let stderr = "";
  try {
    for (const stream of [false, true]) {
      const res = await fetch(`${server.base}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "fast", prompt: "The ship", max_tokens: 4, stream }),
      });
      assert.equal(res.status, 200);
      await res.text();
    }
  } finally {
    ({ stderr } = await server.stop());
  }
  assert.doesNotMatch(stderr, /request\.signal|legacy/, stderr);
  const backend = stderr.split("\n").filter((l) => l.includes("backend"));
  assert.equal(backend.length, 1, stderr);
  assert.match(
    backend[0],
    /^kvrelay: backend auto → cpu for tier fast \((no CUDA device|library built without CUDA)\)$/,
  );
});
