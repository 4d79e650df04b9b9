// Tests of IncrementalDetokenizer on the demo tokenizer (oracle: decoding all ids at once) and on
// a SentencePiece-like fake decoder that drops the leading space of its first piece.

import { assert, assertEquals } from "../tokenizer/_assert.ts";
import { Tokenizer } from "../tokenizer/mod.ts";
import { IncrementalDetokenizer } from "./detokenizer.ts";

const root = new URL("../../", import.meta.url).pathname;
const tok = await Tokenizer.load(`${root}models/tiny-fast`);

function stream(d: IncrementalDetokenizer, ids: number[]): string[] {
  const out = ids.map((id) => d.push(id));
  out.push(d.flush());
  return out;
}

Deno.test("`IncrementalDetokenizer.push()` never splits a UTF-8 character and adds up to decode(all)", () => {
  for (const text of ["plain ascii text", "日本語のテキスト 🎉 héllo", "a🇩🇪b\n\n  c", "€€€"]) {
    const ids = tok.encode(text);
    const deltas = stream(new IncrementalDetokenizer(tok), ids);
    assertEquals(deltas.join(""), text);
    for (const d of deltas) {
      assert(!d.includes("\uFFFD"), `delta ${JSON.stringify(d)} of ${JSON.stringify(text)}`);
    }
  }
});

Deno.test("`IncrementalDetokenizer.flush()` releases an incomplete character at the end as U+FFFD", () => {
  const ids = tok.encode("ok 日");
  const d = new IncrementalDetokenizer(tok);
  const pushed = ids.slice(0, -1).map((id) => d.push(id)).join("");
  assertEquals(pushed, "ok ");
  assertEquals(d.flush(), "\uFFFD");
});

Deno.test("`IncrementalDetokenizer` leaves special tokens out unless skipSpecialTokens is false", () => {
  const ids = tok.encode("a<|im_end|>b");
  assertEquals(stream(new IncrementalDetokenizer(tok), ids).join(""), "ab");
  assertEquals(
    stream(new IncrementalDetokenizer(tok, [], { skipSpecialTokens: false }), ids).join(""),
    "a<|im_end|>b",
  );
});

Deno.test("`IncrementalDetokenizer` keeps a leading space that only the prompt context reveals", () => {
  // SentencePiece-like: piece i is "▁word"; decoding strips the space of the very first piece.
  const pieces = ["▁Hello", "▁big", "▁world", "!"];
  const fake = {
    decode: (ids: ArrayLike<number>) =>
      Array.from(ids, (i) => pieces[i]).join("").replaceAll("▁", " ").replace(/^ /, ""),
  };
  assertEquals(stream(new IncrementalDetokenizer(fake, [0]), [1, 2, 3]).join(""), " big world!");
  assertEquals(stream(new IncrementalDetokenizer(fake, []), [1, 2, 3]).join(""), "big world!");
});

Deno.test("`IncrementalDetokenizer.push()` decodes once per id in the steady state, same text", () => {
  // Each piece is its own text (an oracle independent of the detokenizer); count decode calls.
  const pieces = ["a", "b", "c", "d"];
  let calls = 0;
  const counting = {
    decode: (ids: ArrayLike<number>) => {
      calls++;
      return Array.from(ids, (i) => pieces[i]).join("");
    },
  };
  const ids = [0, 1, 2, 3, 2, 1, 0, 1, 2, 3];
  const d = new IncrementalDetokenizer(counting, [3]);
  d.push(ids[0]); // the first push decodes the context as its prefix
  calls = 0;
  const rest = ids.slice(1).map((id) => d.push(id));
  assertEquals(rest.join(""), ids.slice(1).map((i) => pieces[i]).join(""));
  // Every previous id was seen alone before (ids repeat within 4 values): one call per push for
  // the new text, plus at most one per distinct id for its memoized prefix text.
  assert(calls <= rest.length + pieces.length, `${calls} decode calls for ${rest.length} pushes`);
});
