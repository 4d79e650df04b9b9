// Route tests for logits rows that are not finite, over a doctored tiny-fast whose output layer
// gives two tokens logits of ±inf (so one of them is +inf at every position) or every token NaN:
// a +inf token is certain whatever the sampling settings (it used to spin the sampler's candidate
// widening forever with top_k/top_p/min_p), and a row without a finite logit is a 500, not a hang.
import assert from "node:assert/strict";
import { relative } from "node:path";
import { createGenerateApp } from "./app.ts";
import { post, testRuntime } from "../shared/test_helpers.ts";

const MODELS = new URL("../../models/", import.meta.url).pathname;
const [T, U] = [1000, 1001]; // embedding rows (tied: the output layer) set to ±1e38 in dim 0

// A copy of tiny-fast in a temp dir with rows T/U of the tied embedding = ±1e38·e0 and the final
// norm's dim 0 = `norm0` (1e4 → |h0| ≫ 3.4: logit T or U overflows to +inf; NaN → all NaN).
async function doctored(norm0: number): Promise<string> {
  const src = `${MODELS}tiny-fast`;
  const dir = await Deno.makeTempDir({ prefix: "kvr-nonfinite-" });
  for (const f of Deno.readDirSync(src)) {
    await Deno.copyFile(`${src}/${f.name}`, `${dir}/${f.name}`);
  }
  const bytes = await Deno.readFile(`${dir}/model.safetensors`);
  const dv = new DataView(bytes.buffer);
  const n = Number(dv.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
  const emb = header["model.embed_tokens.weight"], norm = header["model.norm.weight"];
  assert.equal(emb.dtype, "BF16");
  const hidden = emb.shape[1];
  const bf16 = (x: number) => new Uint16Array(new Float32Array([x]).buffer)[1];
  for (const [tok, v] of [[T, 1e38], [U, -1e38]]) {
    for (let d = 0; d < hidden; d++) {
      dv.setUint16(
        8 + n + emb.data_offsets[0] + (tok * hidden + d) * 2,
        d === 0 ? bf16(v) : 0,
        true,
      );
    }
  }
  dv.setUint16(8 + n + norm.data_offsets[0], bf16(norm0), true);
  await Deno.writeFile(`${dir}/model.safetensors`, bytes);
  return dir;
}

// Fails instead of hanging the suite when a request never answers.
async function within<R>(ms: number, what: string, p: R | Promise<R>): Promise<R> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([Promise.resolve(p), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

Deno.test("POST /v1/completions returns the +inf logit's token under every sampling setting, with logprob 0", async () => {
  const dir = await doctored(1e4);
  const rt = await testRuntime({ tiers: { fast: relative(MODELS, dir) } });
  try {
    const app = createGenerateApp(rt);
    const tok = rt.tiers.get("fast")!.model.tokenizer;
    const allowed = new Set([tok.decode([T]), tok.decode([U])]);
    const texts = new Set<string>();
    for (
      const settings of [
        { temperature: 0 },
        { temperature: 1 },
        { temperature: 1, top_k: 5 },
        { temperature: 0.7, top_k: 1 },
        { temperature: 1, top_p: 0.9 },
        { temperature: 1, min_p: 0.1 },
        { temperature: 1.2, top_k: 40, top_p: 0.95, min_p: 0.02 },
        { temperature: 1, top_k: 5, logit_bias: { [T]: -100, [U]: -100 } }, // +inf − 100 is +inf
        { temperature: 1, top_k: 5, logprobs: 3 },
      ]
    ) {
      const what = JSON.stringify(settings);
      const res = await within(
        20_000,
        what,
        app.request(
          "/v1/completions",
          post({ model: "fast", prompt: "Once upon a time", max_tokens: 1, seed: 7, ...settings }),
        ),
      );
      assert.equal(res.status, 200, what);
      const choice = (await res.json()).choices[0];
      assert.ok(allowed.has(choice.text), `${what}: ${JSON.stringify(choice.text)}`);
      texts.add(choice.text);
      if (settings.logprobs) {
        // one +inf token: certain (log 1 = 0), and the only alternative with a finite logprob
        assert.deepEqual(choice.logprobs.token_logprobs, [0], what);
        assert.deepEqual(choice.logprobs.top_logprobs, [{ [choice.text]: 0 }], what);
      }
    }
    assert.equal(texts.size, 1, `one token is +inf at the prompt's end: ${[...texts]}`);
  } finally {
    await rt.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("POST /v1/completions answers 500 (logged, request id) when every logit is NaN", async () => {
  const dir = await doctored(NaN);
  const rt = await testRuntime({ tiers: { fast: relative(MODELS, dir) } });
  // The server logs each 500 with its request id and the error (stack included); kept here and
  // checked instead of filling the test log with expected stack traces.
  const logged: string[] = [];
  const origError = console.error;
  console.error = (...a: unknown[]) => logged.push(a.map(String).join(" "));
  try {
    const app = createGenerateApp(rt);
    for (const settings of [{ temperature: 0 }, { temperature: 1, top_k: 5 }, { temperature: 1 }]) {
      const what = JSON.stringify(settings);
      const res = await within(
        20_000,
        what,
        app.request(
          "/v1/completions",
          post({ model: "fast", prompt: "Hi", max_tokens: 2, ...settings }),
        ),
      );
      assert.equal(res.status, 500, what);
      const body = await res.json();
      assert.equal(body.error.type, "server_error", what);
      assert.match(body.error.message, /^internal server error \(request [0-9a-f-]+\)$/, what);
      const id = /\(request ([0-9a-f-]+)\)$/.exec(body.error.message)?.[1];
      assert.ok(id, `${what}: ${body.error.message}`);
      assert.ok(
        logged.some((l) =>
          l.startsWith(`[${id}] internal error: EngineError: kvr_sampler_sample failed`)
        ),
        `${what}: no log line for request ${id}: ${logged.join("\n")}`,
      );
    }
  } finally {
    console.error = origError;
    await rt.close();
    await Deno.remove(dir, { recursive: true });
  }
});
