// The oracle test: native logits (lib/model + lib/native, f32 compute) against the float64
// TypeScript reference (tests/reference) for the demo models and the generated checkpoints of
// tests/fixtures, at every position of a prefill, a prefill + decodes and two chunked prefills;
// metric max |native − reference| / max |reference logit| < 1e-5, on the default kernels and on the
// portable ones (models loaded with the "generic" kernel cap). Plus a reference-only ppl check.

import assert from "node:assert/strict";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { loadCheckpoint } from "../lib/model/mod.ts";
import { type CpuKernel, type KvDtype, NativeModel } from "../lib/native/mod.ts";
import { mulberry32, ORACLE_CASES, writeRandomCheckpoint } from "./fixtures/random_checkpoint.ts";
import {
  loadReferenceModel,
  meanNll,
  referenceForward,
  type RefModel,
} from "./reference/forward.ts";
import { VALID_SAMPLE_PATH as VALID_TXT } from "./support/corpus.ts";

const MODELS_DIR = new URL("../models", import.meta.url).pathname;
/** f32 compute: observed 3e-7–9e-7; 1e-5 leaves a 10× margin. */
const F32_BOUND = 1e-5;
/** bf16 KV cache: keys/values rounded to 8 significant bits (relative error ≤ 2^-9 ≈ 0.002
 * each), so logits move by about that much: observed 1.2e-3 on tiny-fast over 256 tokens; the
 * bound leaves a 4× margin. */
const BF16_KV_BOUND = 5e-3;
/** f16 KV cache: 11 significant bits (relative error ≤ 2^-12 each, 8× finer than bf16): observed
 * 2.6e-4 (tiny-fast) and 8.4e-5 (tiny-balanced) over 256 tokens; 1e-3 leaves a 4× margin. The
 * decode kernels read the f16 rows in place (cpu/decode_attention.cpp). */
const F16_KV_BOUND = 1e-3;

interface Comparison {
  /** max |native − reference| / max |reference| over all compared positions */
  ratio: number;
  maxDiff: number;
  maxAbs: number;
  /** position and vocab index of the largest difference */
  position: number;
  tokenIndex: number;
}

/** Compares (n, vocab) logits row-major; positions offset by `first` in the report. */
function compare(native: Float32Array, reference: Float64Array, vocab: number): Comparison {
  assert.equal(native.length, reference.length, "logits length");
  let maxDiff = 0, maxAbs = 0, at = 0;
  for (let i = 0; i < reference.length; i++) {
    const diff = Math.abs(native[i] - reference[i]);
    if (!(diff <= maxDiff)) { // also catches NaN
      maxDiff = Number.isNaN(diff) ? Infinity : diff;
      at = i;
    }
    maxAbs = Math.max(maxAbs, Math.abs(reference[i]));
  }
  return {
    ratio: maxDiff / maxAbs,
    maxDiff,
    maxAbs,
    position: Math.floor(at / vocab),
    tokenIndex: at % vocab,
  };
}

function describe(label: string, c: Comparison): string {
  return `${label}: ratio ${c.ratio.toExponential(3)} (max diff ${c.maxDiff.toExponential(3)} ` +
    `at position ${c.position}, token ${c.tokenIndex}; max |logit| ${c.maxAbs.toFixed(3)})`;
}

/**
 * Runs the native model on `tokens` two ways — one prefill with all positions, and a prefill of
 * the first `split` tokens followed by one decode per remaining token, and two chunked prefills
 * (halves) — and compares each with the reference logits, on a model loaded with kernel cap `cap`.
 */
async function nativeVsReference(
  dir: string,
  ref: RefModel,
  tokens: number[],
  refLogits: Float64Array,
  kvDtype: KvDtype,
  split: number,
  cap: CpuKernel = "auto",
): Promise<{ prefill: Comparison; decode: Comparison; chunks: Comparison }> {
  const vocab = ref.config.vocabSize;
  using model = NativeModel.load(await loadCheckpoint(dir), { kvDtype, cpuKernel: cap });
  using seq = model.createSequence(tokens.length);
  const all = await seq.prefill(tokens, { allPositions: true });
  const prefill = compare(all, refLogits, vocab);

  using seq2 = model.createSequence(tokens.length);
  const stepped = new Float32Array(tokens.length * vocab);
  stepped.set(await seq2.prefill(tokens.slice(0, split), { allPositions: true }), 0);
  for (let t = split; t < tokens.length; t++) stepped.set(await seq2.decode(tokens[t]), t * vocab);
  assert.equal(seq2.length, tokens.length);
  const decode = compare(stepped, refLogits, vocab);

  // Two chunked prefills: the second attends over a cached prefix at positions > 0.
  using seq3 = model.createSequence(tokens.length);
  const half = Math.floor(tokens.length / 2);
  const chunked = new Float32Array(tokens.length * vocab);
  chunked.set(await seq3.prefill(tokens.slice(0, half), { allPositions: true }), 0);
  chunked.set(await seq3.prefill(tokens.slice(half), { allPositions: true }), half * vocab);
  const chunks = compare(chunked, refLogits, vocab);
  return { prefill, decode, chunks };
}

let demoTokensCache: number[] | null = null;
/** The first 256 tokens of valid.txt (else of models/README.md) under the demo tokenizer, no
 * special tokens added. */
async function demoTokens(): Promise<number[]> {
  if (demoTokensCache) return demoTokensCache;
  const dir = `${MODELS_DIR}/tiny-fast`;
  const tok = new HfTokenizer(
    JSON.parse(await Deno.readTextFile(`${dir}/tokenizer.json`)),
    JSON.parse(await Deno.readTextFile(`${dir}/tokenizer_config.json`)),
  );
  const text = (await Deno.readTextFile(VALID_TXT)).slice(0, 4000); // ≈ 900 tokens of English
  const ids = tok.encode(text, { add_special_tokens: false }).ids;
  assert.ok(ids.length >= 256, `only ${ids.length} tokens in the first 4000 characters`);
  demoTokensCache = ids.slice(0, 256);
  return demoTokensCache;
}

const referenceCache = new Map<string, { ref: RefModel; logits: Float64Array }>();
async function demoReference(name: string, n: number) {
  const key = `${name}:${n}`;
  let hit = referenceCache.get(key);
  if (!hit) {
    const ref = await loadReferenceModel(`${MODELS_DIR}/${name}`);
    hit = { ref, logits: referenceForward(ref, (await demoTokens()).slice(0, n)) };
    referenceCache.set(key, hit);
  }
  return hit;
}

Deno.test({
  name:
    "reference perplexity of tiny-fast on a 256-token valid.txt window is near the card's 132.5",
}, async () => {
  const tokens = await demoTokens();
  const { ref, logits } = await demoReference("tiny-fast", 256);
  const ppl = Math.exp(meanNll(logits, tokens, ref.config.vocabSize));
  console.log(
    `reference tiny-fast ppl on valid.txt tokens 0..255: ${ppl.toFixed(2)} (card: 132.5)`,
  );
  assert.ok(ppl > 60 && ppl < 300, `ppl ${ppl} outside the band 60..300`);
});

/** The kernel caps the f32 comparisons run under: the default kernels and the portable ones. */
const CAPS: CpuKernel[] = ["auto", "generic"];

// Demo models: tiny-fast over the full 256-token window (its trained context), the larger two
// over the first 40 tokens (the float64 reference is slow on them).
for (
  const [name, n] of [["tiny-fast", 256], ["tiny-balanced", 40], ["tiny-powerful", 40]] as const
) {
  Deno.test(`native logits match the reference on demo ${name} (${n} tokens, f32 KV)`, async () => {
    const tokens = (await demoTokens()).slice(0, n);
    const { ref, logits } = await demoReference(name, n);
    for (const cap of CAPS) {
      const r = await nativeVsReference(
        `${MODELS_DIR}/${name}`,
        ref,
        tokens,
        logits,
        "f32",
        n - 8,
        cap,
      );
      const at = `${name} (${cap})`;
      console.log(describe(`${at} prefill`, r.prefill));
      console.log(describe(`${at} prefill ${n - 8} + decode 8`, r.decode));
      console.log(describe(`${at} two chunked prefills`, r.chunks));
      assert.ok(r.prefill.ratio < F32_BOUND, describe(`${at} prefill`, r.prefill));
      assert.ok(r.decode.ratio < F32_BOUND, describe(`${at} decode`, r.decode));
      assert.ok(r.chunks.ratio < F32_BOUND, describe(`${at} chunked`, r.chunks));
    }
  });
}

Deno.test("native logits stay near the reference on demo tiny-fast with a bf16 KV cache (256 tokens)", async () => {
  const tokens = await demoTokens();
  const { ref, logits } = await demoReference("tiny-fast", 256);
  const r = await nativeVsReference(`${MODELS_DIR}/tiny-fast`, ref, tokens, logits, "bf16", 248);
  console.log(describe("tiny-fast bf16 KV prefill", r.prefill));
  console.log(describe("tiny-fast bf16 KV prefill 248 + decode 8", r.decode));
  assert.ok(r.prefill.ratio < BF16_KV_BOUND, describe("bf16 KV prefill", r.prefill));
  assert.ok(r.decode.ratio < BF16_KV_BOUND, describe("bf16 KV decode", r.decode));
  assert.ok(r.chunks.ratio < BF16_KV_BOUND, describe("bf16 KV chunked", r.chunks));
});

for (const name of ["tiny-fast", "tiny-balanced"]) {
  Deno.test(`native logits stay near the reference on demo ${name} with an f16 KV cache (256 tokens)`, async () => {
    const tokens = await demoTokens();
    const { ref, logits } = await demoReference(name, 256);
    const r = await nativeVsReference(`${MODELS_DIR}/${name}`, ref, tokens, logits, "f16", 200);
    console.log(describe(`${name} f16 KV prefill`, r.prefill));
    console.log(describe(`${name} f16 KV prefill 200 + decode 56`, r.decode));
    assert.ok(r.prefill.ratio < F16_KV_BOUND, describe("f16 KV prefill", r.prefill));
    assert.ok(r.decode.ratio < F16_KV_BOUND, describe("f16 KV decode", r.decode));
    assert.ok(r.chunks.ratio < F16_KV_BOUND, describe("f16 KV chunked", r.chunks));
  });
}

ORACLE_CASES.forEach((spec, i) => {
  Deno.test(`native logits match the reference on generated ${spec.name}`, async () => {
    const dir = await Deno.makeTempDir({ prefix: `kvrelay-oracle-${spec.name}-` });
    try {
      await writeRandomCheckpoint(dir, spec);
      const n = 24 + ((i * 7) % 17); // 24..40 tokens
      const uniform = mulberry32(1000 + i);
      const tokens = Array.from({ length: n }, () => Math.floor(uniform() * spec.vocab));
      const ref = await loadReferenceModel(dir);
      const logits = referenceForward(ref, tokens);
      const split = Math.max(1, n - 6);
      for (const cap of CAPS) {
        const r = await nativeVsReference(dir, ref, tokens, logits, "f32", split, cap);
        const at = `${spec.name} (${cap})`;
        console.log(describe(`${at} prefill ${n}`, r.prefill));
        console.log(describe(`${at} prefill ${split} + decode ${n - split}`, r.decode));
        console.log(describe(`${at} two chunked prefills`, r.chunks));
        assert.ok(r.prefill.ratio < F32_BOUND, describe(`${at} prefill`, r.prefill));
        assert.ok(r.decode.ratio < F32_BOUND, describe(`${at} decode`, r.decode));
        assert.ok(r.chunks.ratio < F32_BOUND, describe(`${at} chunked`, r.chunks));
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
});
