// Tests for readSafetensorsHeader/readTensorBytes/encodeSafetensors on hand-crafted files: valid
// layouts (known byte positions), and hostile ones (truncated, huge N, bad JSON/UTF-8, bad dtype,
// shape/bytes mismatch, offsets out of range or overlapping).

import assert from "node:assert/strict";
import { encodeSafetensors, readSafetensorsHeader, readTensorBytes } from "./safetensors.ts";
import { ModelFormatError } from "./errors.ts";
import { rawSafetensors, tempDir } from "./test_helpers.ts";

const dir = await tempDir("kvr-st-test-");
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
let counter = 0;
async function write(bytes: Uint8Array): Promise<string> {
  const path = `${dir}/f${counter++}.safetensors`;
  await Deno.writeFile(path, bytes);
  return path;
}

function header(obj: unknown): string {
  return JSON.stringify(obj);
}

async function file(obj: unknown, dataBytes: number): Promise<string> {
  const h = header(obj);
  const len = new TextEncoder().encode(h).length;
  return await write(rawSafetensors(BigInt(len), h, new Uint8Array(dataBytes)));
}

async function rejects(path: string, pattern: RegExp): Promise<void> {
  await assert.rejects(readSafetensorsHeader(path), (e: unknown) => {
    assert.ok(e instanceof ModelFormatError, `expected ModelFormatError, got ${e}`);
    assert.match(e.message, pattern);
    assert.equal(e.path, path);
    return true;
  });
}

Deno.test("`readSafetensorsHeader()` returns absolute offsets sorted by position for a valid file", async () => {
  const h = header({
    __metadata__: { format: "pt" },
    "b": { dtype: "F16", shape: [3], data_offsets: [8, 14] },
    "a": { dtype: "F32", shape: [2], data_offsets: [0, 8] },
    "c": { dtype: "BF16", shape: [2, 2], data_offsets: [14, 22] },
  });
  const n = new TextEncoder().encode(h).length;
  const data = Uint8Array.from({ length: 22 }, (_, i) => i + 100);
  const path = await write(rawSafetensors(BigInt(n), h, data));
  const r = await readSafetensorsHeader(path);
  assert.equal(r.headerBytes, n);
  assert.equal(r.fileSize, 8 + n + 22);
  assert.deepEqual(r.tensors.map((t) => [t.name, t.dtype, t.shape, t.offset, t.nbytes, t.file]), [
    ["a", "F32", [2], 8 + n, 8, path],
    ["b", "F16", [3], 8 + n + 8, 6, path],
    ["c", "BF16", [2, 2], 8 + n + 14, 8, path],
  ]);
  assert.deepEqual([...await readTensorBytes(r.tensors[1])], [108, 109, 110, 111, 112, 113]);
  assert.deepEqual([...await readTensorBytes(r.tensors[2], 2, 4)], [116, 117]);
  await assert.rejects(readTensorBytes(r.tensors[1], 0, 7), RangeError);
});

Deno.test("`readSafetensorsHeader()` accepts a zero-size tensor and an empty header object", async () => {
  const r = await readSafetensorsHeader(
    await file({ z: { dtype: "F32", shape: [0, 4], data_offsets: [0, 0] } }, 0),
  );
  assert.equal(r.tensors[0].nbytes, 0);
  assert.deepEqual((await readSafetensorsHeader(await file({}, 0))).tensors, []);
});

Deno.test("`readSafetensorsHeader()` rejects files shorter than the 8-byte prefix", async () => {
  await rejects(await write(new Uint8Array(5)), /truncated: file has 5 bytes/);
});

Deno.test("`readSafetensorsHeader()` rejects a header length above 100 MB or past the file end", async () => {
  await rejects(
    await write(rawSafetensors(2n ** 40n, "{}")),
    /header length 1099511627776 exceeds/,
  );
  await rejects(
    await write(rawSafetensors(2n ** 64n - 1n, "{}")),
    /header length 18446744073709551615 exceeds/,
  );
  await rejects(
    await write(rawSafetensors(100n, "{}")),
    /truncated: header length 100 exceeds the 2 bytes/,
  );
});

Deno.test("`readSafetensorsHeader()` rejects invalid JSON, non-UTF-8 and non-object headers", async () => {
  await rejects(await write(rawSafetensors(5n, '{"a":')), /not valid JSON/);
  await rejects(await write(rawSafetensors(2n, new Uint8Array([0xff, 0xfe]))), /not valid UTF-8/);
  await rejects(await write(rawSafetensors(7n, "[1,2,3]")), /must be a JSON object, got \[1,2,3\]/);
  await rejects(await file({ a: 5 }, 0), /tensor "a": entry must be an object, got 5/);
  await rejects(await file({ __metadata__: [1] }, 0), /__metadata__ must be an object/);
});

Deno.test("`readSafetensorsHeader()` rejects unsupported dtypes, quoting them", async () => {
  await rejects(
    await file({ w: { dtype: "I8", shape: [4], data_offsets: [0, 4] } }, 4),
    /tensor "w": unsupported dtype "I8"/,
  );
  await rejects(
    await file({ w: { dtype: "F64", shape: [1], data_offsets: [0, 8] } }, 8),
    /unsupported dtype "F64"/,
  );
  await rejects(
    await file({ w: { dtype: 3, shape: [1], data_offsets: [0, 4] } }, 4),
    /dtype must be a string, got 3/,
  );
});

Deno.test("`readSafetensorsHeader()` rejects a shape whose byte size differs from data_offsets", async () => {
  await rejects(
    await file({ w: { dtype: "F32", shape: [2, 3], data_offsets: [0, 20] } }, 24),
    /tensor "w": shape \[2,3\] × 4 bytes \(F32\) does not match data_offsets \[0,20\] \(20 bytes\)/,
  );
  await rejects(
    await file({ w: { dtype: "F32", shape: [2 ** 40, 2 ** 40], data_offsets: [0, 4] } }, 4),
    /does not match/,
  );
  await rejects(
    await file({ w: { dtype: "F32", shape: [-1], data_offsets: [0, 4] } }, 4),
    /shape must be an array/,
  );
  await rejects(
    await file({ w: { dtype: "F32", shape: [1.5], data_offsets: [0, 4] } }, 4),
    /shape must be an array/,
  );
});

Deno.test("`readSafetensorsHeader()` rejects offsets out of range, reversed, unsafe or overlapping", async () => {
  await rejects(
    await file({ w: { dtype: "F32", shape: [4], data_offsets: [0, 16] } }, 12),
    /tensor "w": data_offsets \[0,16\] extend past the data region \(12 bytes\)/,
  );
  await rejects(
    await file({ w: { dtype: "F32", shape: [1], data_offsets: [8, 4] } }, 8),
    /0 <= begin <= end, got \[8,4\]/,
  );
  await rejects(
    await file({ w: { dtype: "F32", shape: [1], data_offsets: [2 ** 60, 2 ** 60 + 4] } }, 8),
    /data_offsets must be/,
  );
  await rejects(
    await file({ w: { dtype: "F32", shape: [1], data_offsets: [0] } }, 8),
    /data_offsets must be/,
  );
  await rejects(
    await file({
      a: { dtype: "F32", shape: [2], data_offsets: [0, 8] },
      b: { dtype: "F32", shape: [2], data_offsets: [4, 12] },
    }, 12),
    /tensors "a" \[0, 8\) and "b" \[4, 12\) overlap/,
  );
});

Deno.test("`readSafetensorsHeader()` rejects a missing file with a ModelFormatError", async () => {
  await rejects(`${dir}/does-not-exist.safetensors`, /cannot open/);
});

Deno.test("`encodeSafetensors()` writes the u64 length, a space-padded header and the data in order", async () => {
  const bytes = encodeSafetensors([
    { name: "x", dtype: "F32", shape: [1], data: new Uint8Array([1, 2, 3, 4]) },
    { name: "y", dtype: "BF16", shape: [1, 1], data: new Uint8Array([5, 6]) },
  ]);
  const json =
    '{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"BF16","shape":[1,1],"data_offsets":[4,6]}}';
  const padded = Math.ceil(json.length / 8) * 8;
  assert.equal(new DataView(bytes.buffer).getBigUint64(0, true), BigInt(padded));
  const text = new TextDecoder().decode(bytes.subarray(8, 8 + padded));
  assert.equal(text, json + " ".repeat(padded - json.length));
  assert.deepEqual([...bytes.subarray(8 + padded)], [1, 2, 3, 4, 5, 6]);
  const r = await readSafetensorsHeader(await write(bytes));
  assert.deepEqual(r.tensors.map((t) => t.offset), [8 + padded, 8 + padded + 4]);
  assert.throws(
    () => encodeSafetensors([{ name: "x", dtype: "F16", shape: [3], data: new Uint8Array(4) }]),
    /needs 6 bytes, got 4/,
  );
});

Deno.test("`readSafetensorsHeader()` reads a demo checkpoint header (46 tensors, BF16)", async () => {
  const r = await readSafetensorsHeader(
    new URL("../../models/tiny-fast/model.safetensors", import.meta.url).pathname,
  );
  assert.equal(r.tensors.length, 46);
  assert.ok(r.tensors.every((t) => t.dtype === "BF16"));
  const embed = r.tensors.find((t) => t.name === "model.embed_tokens.weight")!;
  assert.deepEqual(embed.shape, [4096, 128]);
  assert.equal(embed.nbytes, 4096 * 128 * 2);
  assert.equal(embed.offset, 8 + r.headerBytes);
});
