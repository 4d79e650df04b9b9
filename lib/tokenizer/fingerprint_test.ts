// Tests of the tokenizer fingerprint: canonical JSON against hand-written known answers, SHA-256
// against a digest computed outside this code (Python hashlib), and invariance/sensitivity.

import { assertEquals, assertNotEquals, assertThrows } from "./_assert.ts";
import { canonicalJson, fingerprintSubject, tokenizerFingerprint } from "./mod.ts";

const tiny = {
  version: "1.0",
  added_tokens: [
    {
      id: 4,
      content: "<eos>",
      special: true,
      lstrip: false,
      rstrip: false,
      normalized: false,
      single_word: false,
    },
  ],
  normalizer: null,
  pre_tokenizer: {
    type: "ByteLevel",
    add_prefix_space: false,
    trim_offsets: true,
    use_regex: true,
  },
  post_processor: null,
  decoder: { type: "ByteLevel" },
  model: {
    type: "BPE",
    dropout: null,
    unk_token: null,
    vocab: { b: 1, a: 0, ab: 2, c: 3 },
    merges: ["a b"],
  },
};

// Written by hand from the rules in fingerprintSubject's JSDoc.
const TINY_CANONICAL =
  '{"added_tokens":[{"content":"<eos>","id":4,"lstrip":false,"normalized":false,' +
  '"rstrip":false,"single_word":false,"special":true}],"model":{"merges":[["a","b"]],"type":"BPE",' +
  '"unk_token":null,"vocab":[[0,"a"],[1,"b"],[2,"ab"],[3,"c"]]},"normalizer":null,' +
  '"pre_tokenizer":{"add_prefix_space":false,"trim_offsets":true,"type":"ByteLevel","use_regex":true}}';
// python3 -c "import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())" "$TINY_CANONICAL"
const TINY_SHA256 = "7e8921b3294745f2508446ff1c3f7a1cd59af2a02b5157d02fdb9fd74fa5c808";

Deno.test("`canonicalJson()` sorts keys, drops undefined members and keeps array order", () => {
  assertEquals(
    canonicalJson({ b: 1, a: [3, { d: null, c: "x" }], u: undefined }),
    '{"a":[3,{"c":"x","d":null}],"b":1}',
  );
  assertEquals(canonicalJson("é\n"), '"é\\n"');
  assertThrows(() => canonicalJson({ x: NaN }), TypeError, "NaN");
});

Deno.test("`fingerprintSubject()` lists vocab by id, merges as pairs and drops decoder/post-processor", () => {
  assertEquals(canonicalJson(fingerprintSubject(tiny)), TINY_CANONICAL);
});

Deno.test("`tokenizerFingerprint()` is the SHA-256 of the canonical JSON computed by hashlib", async () => {
  assertEquals(await tokenizerFingerprint(tiny), TINY_SHA256);
});

Deno.test("`tokenizerFingerprint()` ignores formatting, key order and merge spelling", async () => {
  const reordered = JSON.parse(JSON.stringify(
    {
      model: {
        merges: [["a", "b"]],
        vocab: { c: 3, ab: 2, b: 1, a: 0 },
        unk_token: null,
        type: "BPE",
      },
      decoder: null,
      pre_tokenizer: {
        use_regex: true,
        type: "ByteLevel",
        trim_offsets: true,
        add_prefix_space: false,
      },
      normalizer: null,
      added_tokens: tiny.added_tokens,
    },
    null,
    2,
  ));
  assertEquals(await tokenizerFingerprint(reordered), TINY_SHA256);
});

Deno.test("`tokenizerFingerprint()` changes when a merge, an id, an added token or the pre-tokenizer changes", async () => {
  const variants = [
    { ...tiny, model: { ...tiny.model, merges: ["b a"] } },
    { ...tiny, model: { ...tiny.model, vocab: { a: 0, b: 1, ab: 3, c: 2 } } },
    { ...tiny, added_tokens: [{ ...tiny.added_tokens[0], special: false }] },
    { ...tiny, pre_tokenizer: { ...tiny.pre_tokenizer, add_prefix_space: true } },
    { ...tiny, normalizer: { type: "NFC" } },
  ];
  for (const v of variants) assertNotEquals(await tokenizerFingerprint(v), TINY_SHA256);
});

Deno.test("`fingerprintSubject()` throws TypeError quoting a malformed merge", () => {
  assertThrows(
    () => fingerprintSubject({ model: { type: "BPE", vocab: {}, merges: ["abc"] } }),
    TypeError,
    '"abc"',
  );
  assertThrows(() => fingerprintSubject({}), TypeError, "model");
});
