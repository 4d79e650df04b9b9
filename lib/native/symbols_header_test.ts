// symbols.ts against native/include/kvrelay.h, and test_symbols.ts against kvrelay_test.h: every
// KVR_API function is opened with the FFI types of its C declaration, and no symbol names a
// function its header lacks. Reads the header text (no library needed).

import assert from "node:assert/strict";
import { compareWithHeader, parseHeader } from "./header_symbols.ts";
import { symbols } from "./symbols.ts";
import { testSymbols } from "./test_symbols.ts";

const HEADER = new URL("../../native/include/kvrelay.h", import.meta.url);
const TEST_HEADER = new URL("../../native/include/kvrelay_test.h", import.meta.url);

Deno.test("symbols.ts opens every kvrelay.h function with its declared FFI types", async () => {
  const functions = parseHeader(await Deno.readTextFile(HEADER));
  assert.ok(functions.length > 50, `parsed only ${functions.length} KVR_API functions`);
  const diff = compareWithHeader(functions, symbols);
  assert.deepEqual(diff, [], `symbols.ts differs from kvrelay.h:\n  ${diff.join("\n  ")}`);
});

Deno.test("test_symbols.ts opens every kvrelay_test.h function with its declared FFI types", async () => {
  const functions = parseHeader(
    await Deno.readTextFile(TEST_HEADER),
    await Deno.readTextFile(HEADER),
  );
  assert.ok(functions.length >= 8, `parsed only ${functions.length} KVR_API functions`);
  const diff = compareWithHeader(functions, testSymbols);
  assert.deepEqual(
    diff,
    [],
    `test_symbols.ts differs from kvrelay_test.h:\n  ${diff.join("\n  ")}`,
  );
});

Deno.test("`compareWithHeader()` names a missing function, an extra symbol and a type change", () => {
  const functions = parseHeader(`
    typedef struct kvr_seq kvr_seq;
    KVR_API int32_t kvr_a(kvr_seq* seq, const float* x, size_t n); /* a, b) */
    KVR_API const char* kvr_b(const kvr_seq* seq);
    KVR_API uint32_t kvr_c(void);
  `);
  assert.deepEqual(functions, [
    { name: "kvr_a", result: "i32", parameters: ["pointer", "buffer", "usize"] },
    { name: "kvr_b", result: "pointer", parameters: ["pointer"] },
    { name: "kvr_c", result: "u32", parameters: [] },
  ]);
  assert.deepEqual(
    compareWithHeader(functions, {
      kvr_a: { parameters: ["pointer", "buffer", "u32"], result: "i32" },
      kvr_b_sync: { name: "kvr_b", parameters: ["pointer"], result: "pointer" },
      kvr_d: { parameters: [], result: "void" },
    }),
    [
      "kvr_a: header (pointer, buffer, usize) -> i32, symbols (pointer, buffer, u32) -> i32",
      "kvr_d: no KVR_API function kvr_d in the header",
      "kvr_c: declared in the header, not in the symbols",
    ],
  );
});
