// End-to-end: starts the real `functions/main.ts` process (what `deno task start` runs, with the
// bundled config/local.json) and drives it with the official `openai` npm client and fetch, as a
// user following the README would; also the refusal to start on an invalid config, and SIGTERM.
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, writeConfig } from "./e2e_support.ts";

const root = new URL("../", import.meta.url).pathname;

Deno.test("the served functions answer the openai client (chat, streaming with usage, completions) and fetch", async () => {
  const server = await startServer("functions/main.ts", {});
  try {
    const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: "unused", maxRetries: 0 });
    const models = await client.models.list();
    assert.deepEqual(models.data.map((m) => m.id), ["fast", "balanced", "powerful"]);

    const chat = await client.chat.completions.create({
      model: "fast",
      messages: [{ role: "user", content: "Tell me about the sea." }],
      max_tokens: 8,
    });
    assert.equal(chat.object, "chat.completion");
    assert.equal(typeof chat.choices[0].message.content, "string");
    assert.ok(["stop", "length"].includes(chat.choices[0].finish_reason));
    assert.ok(chat.usage!.completion_tokens >= 1 && chat.usage!.completion_tokens <= 8);

    const stream = await client.chat.completions.create({
      model: "balanced",
      messages: [{ role: "user", content: "Once upon a time" }],
      max_tokens: 8,
      temperature: 0, // greedy, so the non-streamed answer below must match
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      if (chunk.choices[0]) {
        text += chunk.choices[0].delta.content ?? "";
        finish = chunk.choices[0].finish_reason ?? finish;
      }
      if (chunk.usage) usage = chunk.usage;
    }
    assert.ok(finish === "length" || finish === "stop");
    assert.ok(usage && usage.completion_tokens >= 1, JSON.stringify(usage));
    assert.equal(usage!.total_tokens, usage!.prompt_tokens + usage!.completion_tokens);
    assert.equal(typeof text, "string");

    const non = await client.chat.completions.create({
      model: "balanced",
      messages: [{ role: "user", content: "Once upon a time" }],
      max_tokens: 8,
      temperature: 0,
    });
    assert.equal(
      non.choices[0].message.content,
      text,
      "streamed text equals the non-streamed greedy text",
    );

    const cmpl = await client.completions.create({
      model: "powerful",
      prompt: ["The ship sailed", "Call me"],
      max_tokens: 6,
    });
    assert.equal(cmpl.choices.length, 2);
    assert.ok(cmpl.usage!.completion_tokens >= 2);

    const gen = await fetch(`${server.base}/v1/generate`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "The ship", user_id: "e2e", max_tokens: 4 }),
    });
    const body = await gen.json();
    assert.equal(body.tier, "fast");
    assert.equal(body.migrated, false);
    assert.ok(body.tokens >= 1);

    const err = await fetch(`${server.base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{",
    });
    assert.equal(err.status, 400);
    assert.equal((await err.json()).error.param, "body");
    await assert.rejects(
      client.completions.create({ model: "gigantic", prompt: "x", max_tokens: 1 }),
      (e: unknown) => e instanceof OpenAI.NotFoundError,
    );
  } finally {
    const { status } = await server.stop();
    assert.equal(status.code, 0, `exit ${JSON.stringify(status)}`);
  }
});

Deno.test("the server refuses to start on an invalid config, listing every problem by path", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(
      `${dir}/bad.json`,
      JSON.stringify({ tiers: { a: { model: "", queue_depth: -1 } }, default_tier: "b" }),
    );
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", `${root}functions/main.ts`],
      env: { KVRELAY_CONFIG: `${dir}/bad.json`, PORT: "0" },
      stdout: "null",
      stderr: "piped",
    }).output();
    const err = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 2, err);
    assert.match(err, /refusing to start/);
    assert.match(err, /tiers\.a\.model/);
    assert.match(err, /tiers\.a\.queue_depth/);
    assert.doesNotMatch(err, /\n\s+at /);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("SIGTERM drains: an in-flight request completes and the process exits 0", async () => {
  const server = await startServer("functions/generate/main.ts", {});
  const res = await fetch(`${server.base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "powerful",
      prompt: "The ship",
      max_tokens: 200,
      ignore_eos: true,
      stream: true,
      stream_options: { include_usage: true },
    }),
  });
  assert.equal(res.status, 200);
  // The first frame proves the request is in flight (a fixed wait raced the connect on a busy
  // machine); the signal comes while it generates.
  const reader = res.body!.getReader();
  const dec = new TextDecoder();
  let text = dec.decode((await reader.read()).value, { stream: true });
  const stopped = server.stop();
  for (let r = await reader.read(); !r.done; r = await reader.read()) {
    text += dec.decode(r.value, { stream: true });
  }
  assert.doesNotMatch(text, /"error"/);
  assert.match(text, /data: \[DONE\]/);
  // It ran to max_tokens (a token whose text is empty sends no frame: count by the usage frame).
  assert.match(text, /"finish_reason":"length"/);
  const usage = text.split("\n").filter((l) => l.includes('"completion_tokens"')).at(-1);
  assert.ok(usage, text);
  assert.equal(
    JSON.parse(usage.slice("data: ".length)).usage.completion_tokens,
    200,
    "every token of the in-flight request was generated",
  );
  const { status, stderr } = await stopped;
  assert.equal(status.code, 0, stderr);
  assert.match(stderr, /draining/);
});

Deno.test("SIGTERM with stalled uploads open: connections are closed and the process exits after the grace period", async () => {
  const config = await writeConfig({ fast: "tiny-fast" }, {}, {
    server: { shutdown_grace_ms: 500, body_timeout_ms: 60000 },
  });
  const server = await startServer("functions/main.ts", { KVRELAY_CONFIG: config });
  const conns: Deno.Conn[] = [];
  try {
    // Two clients that promise a body and never finish it: one JSON, one snapshot.
    for (
      const [path, type] of [
        ["/v1/chat/completions", "application/json"],
        ["/v1/decode", "application/vnd.kvrelay.snapshot"],
      ]
    ) {
      const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.port });
      await conn.write(new TextEncoder().encode(
        `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: ${type}\r\nContent-Length: 100000\r\n\r\n{"mess`,
      ));
      conns.push(conn);
    }
    await new Promise((r) => setTimeout(r, 200));
    const t0 = performance.now();
    const stopped = server.stop();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = await Promise.race([
      stopped.then(() => false),
      new Promise<boolean>((r) => timer = setTimeout(() => r(true), 8000)),
    ]);
    clearTimeout(timer);
    if (late) {
      server.child.kill("SIGKILL");
      await stopped;
      assert.fail("the process was still running 8 s after SIGTERM (grace 500 ms)");
    }
    const { status, stderr } = await stopped;
    const ms = performance.now() - t0;
    assert.equal(status.code, 0, stderr);
    assert.match(stderr, /stopped/);
    assert.ok(ms < 500 + 5000, `exited ${Math.round(ms)} ms after SIGTERM (grace 500 ms)`);
  } finally {
    for (const c of conns) {
      try {
        c.close();
      } catch {
        // already closed by the server
      }
    }
  }
});
