// End-to-end tests of the CLI: each test spawns `deno run -A lib/cli/main.ts ...` as a real process
// and checks stdout, stderr and the exit code. Oracles: lib/engine generate() in this process,
// token counts from the tokenizer, NLL from fresh prefills and a log-softmax written here.

import { readValidSample } from "../../tests/support/corpus.ts";
import { assert, assertEquals } from "../tokenizer/_assert.ts";
import { generate, loadModel } from "../engine/mod.ts";

const root = new URL("../../", import.meta.url).pathname;
const MODEL = `${root}models/tiny-fast`;

async function cli(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${root}lib/cli/main.ts`, ...args],
    cwd: root,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

Deno.test("`cli generate` prints exactly the greedy completion lib/engine generate() returns", async () => {
  const prompt = "In conformity to the powers vested in me";
  const r = await cli(
    "generate",
    "--model",
    MODEL,
    "--prompt",
    prompt,
    "--max-tokens",
    "24",
    "--threads",
    "1",
  );
  assertEquals(r.code, 0, r.stderr);
  const m = await loadModel(MODEL, { threads: 1 });
  try {
    const expected = await generate(m, prompt, { temperature: 0, maxTokens: 24 });
    assertEquals(r.stdout, expected.text);
    assert(expected.text.length > 0);
  } finally {
    m.native.free();
  }
});

Deno.test("`cli generate --repetition-penalty` prints generate()'s penalised greedy completion", async () => {
  const prompt = "Call me";
  const args = ["--model", MODEL, "--prompt", prompt, "--max-tokens", "24", "--threads", "1"];
  const r = await cli("generate", ...args, "--repetition-penalty", "1.3");
  assertEquals(r.code, 0, r.stderr);
  const m = await loadModel(MODEL, { threads: 1 });
  try {
    const opts = { temperature: 0, maxTokens: 24 };
    const expected = await generate(m, prompt, { ...opts, repetitionPenalty: 1.3 });
    assertEquals(r.stdout, expected.text);
    assert(expected.text !== (await generate(m, prompt, opts)).text, "the penalty matters here");
  } finally {
    m.native.free();
  }
  const bad = await cli("generate", ...args, "--repetition-penalty", "0");
  assertEquals(bad.code, 2);
  assert(bad.stderr.includes("--repetition-penalty"), bad.stderr);
});

Deno.test("`cli generate --chat` completes the prompt wrapped in the chat template", async () => {
  const r = await cli(
    "generate",
    "--model",
    MODEL,
    "--prompt",
    "Hi",
    "--chat",
    "--max-tokens",
    "8",
  );
  assertEquals(r.code, 0, r.stderr);
  const m = await loadModel(MODEL, { threads: 1 });
  try {
    const prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    assertEquals(r.stdout, (await generate(m, prompt, { temperature: 0, maxTokens: 8 })).text);
  } finally {
    m.native.free();
  }
});

Deno.test("`cli generate` repeats a seeded sampled completion and honours --stop", async () => {
  const args = ["generate", "--model", MODEL, "--prompt", "Once upon a time", "--max-tokens", "20"];
  const a = await cli(...args, "--temperature", "0.9", "--top-p", "0.9", "--seed", "3");
  const b = await cli(...args, "--temperature", "0.9", "--top-p", "0.9", "--seed", "3");
  assertEquals(a.code, 0, a.stderr);
  assertEquals(a.stdout, b.stdout);
  const greedy = await cli(...args);
  const stop = greedy.stdout.slice(5, 8);
  const stopped = await cli(...args, "--stop", stop);
  assertEquals(stopped.code, 0, stopped.stderr);
  assertEquals(stopped.stdout, greedy.stdout.slice(0, greedy.stdout.indexOf(stop)));
});

Deno.test("`cli score --json` gives the token count, mean NLL and ppl of an independent computation", async () => {
  const text =
    "The abundant fruits of another year have blessed our country with plenty and with the " +
    "means of a flourishing commerce. The progress of public credit is witnessed by a considerable rise.";
  const file = await Deno.makeTempFile({ suffix: ".txt" });
  try {
    await Deno.writeTextFile(file, text);
    const context = 16;
    const r = await cli(
      "score",
      "--model",
      MODEL,
      "--file",
      file,
      "--context",
      String(context),
      "--json",
    );
    assertEquals(r.code, 0, r.stderr);
    const got = JSON.parse(r.stdout);
    assertEquals(Object.keys(got).sort(), ["mean_nll", "ppl", "tokens"]);
    const m = await loadModel(MODEL, { threads: 2 });
    try {
      const ids = m.tokenizer.encode(text);
      // Windows of 16: each full window predicts 15, the tail predicts len − 1 (if ≥ 2 tokens).
      const tail = ids.length % context;
      const expectedTokens = Math.floor(ids.length / context) * (context - 1) +
        (tail >= 2 ? tail - 1 : 0);
      assertEquals(got.tokens, expectedTokens);
      let total = 0;
      const vocab = m.native.config.vocabSize;
      for (let s = 0; s < ids.length; s += context) {
        const w = ids.slice(s, s + context);
        if (w.length < 2) continue;
        const seq = m.native.createSequence(w.length);
        const logits = await seq.prefill(w, { allPositions: true });
        seq.free();
        for (let i = 0; i + 1 < w.length; i++) {
          let z = 0;
          for (let j = 0; j < vocab; j++) z += Math.exp(logits[i * vocab + j]);
          total += Math.log(z) - logits[i * vocab + w[i + 1]];
        }
      }
      const mean = total / expectedTokens;
      assert(Math.abs(got.mean_nll - mean) < 1e-5, `${got.mean_nll} vs ${mean}`);
      assert(Math.abs(got.ppl - Math.exp(got.mean_nll)) < 1e-9 * got.ppl);
    } finally {
      m.native.free();
    }
  } finally {
    await Deno.remove(file);
  }
});

Deno.test("`cli score` on 20k characters of valid.txt gives tiny-fast a ppl near its card's 132", async () => {
  const text = (await readValidSample()).slice(0, 20_000);
  const file = await Deno.makeTempFile({ suffix: ".txt" });
  try {
    await Deno.writeTextFile(file, text);
    const r = await cli("score", "--model", MODEL, "--file", file, "--context", "256", "--json");
    assertEquals(r.code, 0, r.stderr);
    const { tokens, ppl } = JSON.parse(r.stdout);
    assert(tokens > 4000, `tokens ${tokens}`);
    assert(ppl > 80 && ppl < 250, `ppl ${ppl}`);
  } finally {
    await Deno.remove(file);
  }
});

Deno.test("`cli` prints one error line and exits non-zero for bad usage or a missing model", async () => {
  const cases: [string[], number, string][] = [
    [["generate", "--prompt", "x"], 2, "--model is required"],
    [["generate", "--model", MODEL, "--prompt", "x", "--max-tokens", "abc"], 2, '"abc"'],
    [["generate", "--model", MODEL, "--prompt", "x", "--bogus"], 2, "bogus"],
    [["generate", "--model", "/nonexistent/model", "--prompt", "x"], 1, "/nonexistent/model"],
    [
      ["generate", "--model", MODEL, "--prompt", "x", "--top-p", "2"],
      2,
      "--top-p must be in (0, 1]",
    ],
    [["score", "--model", MODEL, "--file", "/nonexistent.txt"], 1, "/nonexistent.txt"],
    [["score", "--model", MODEL, "--file", "x", "--context", "1"], 2, "--context"],
    [["frobnicate"], 2, "unknown command"],
    [[], 2, "usage"],
  ];
  for (const [args, code, needle] of cases) {
    const r = await cli(...args);
    const ctx = `${args.join(" ")} → ${JSON.stringify(r.stderr)}`;
    assertEquals(r.code, code, ctx);
    assertEquals(r.stdout, "", ctx);
    assert(r.stderr.includes(needle), ctx);
    if (args.length > 0) assertEquals(r.stderr.trimEnd().split("\n").length, 1, ctx);
  }
  const help = await cli("generate", "--help");
  assertEquals(help.code, 0);
  assert(help.stdout.includes("--max-tokens"));
});

Deno.test("`cli generate --backend cuda` fails with the CUDA probe's reason; --backend auto runs on the CPU and says why once (the implicit default quietly)", async () => {
  const { autoFallbackWords, probeBackend } = await import("../native/mod.ts");
  const reason = probeBackend("cuda").info;
  const args = ["generate", "--model", MODEL, "--prompt", "Hello", "--max-tokens", "2"];
  const cuda = await cli(...args, "--threads", "1", "--backend", "cuda");
  assertEquals(cuda.code, 1, cuda.stderr);
  assertEquals(cuda.stdout, "");
  assertEquals(cuda.stderr.includes(`UNSUPPORTED, -5): ${reason}`), true, cuda.stderr);
  const auto = await cli(...args, "--threads", "1", "--backend", "auto");
  assertEquals(auto.code, 0, auto.stderr);
  const cpu = await cli(...args, "--threads", "1", "--backend", "cpu");
  assertEquals(auto.stdout, cpu.stdout);
  assertEquals(
    auto.stderr.split("\n").filter((l) => l.includes("backend auto")),
    [`kvrelay: backend auto → cpu (${autoFallbackWords(reason)})`],
  );
  assertEquals(cpu.stderr.includes("backend auto"), false);
  const implicit = await cli(...args, "--threads", "1"); // default auto: quiet on the CPU
  assertEquals(implicit.stdout, cpu.stdout);
  assertEquals(implicit.stderr.includes("backend auto"), false, implicit.stderr);
});
