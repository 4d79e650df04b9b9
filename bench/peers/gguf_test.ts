// Tests of the GGUF writer: an independent reader (test_gguf_reader.ts) parses back every value
// type, tensor info and data byte; Q8_0 quantization against a plain float64 statement of the
// format (scale = max|x|/127 rounded to f16, q = round-half-away(x/scale)).

import assert from "node:assert/strict";
import { f16Bits, type GgufValue, quantizeQ4_0, quantizeQ8_0, writeGguf } from "./gguf.ts";
import { parseGguf } from "./test_gguf_reader.ts";

async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "kvrelay-gguf-" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("writeGguf() writes metadata of every kind and tensors that an independent reader parses back", async () => {
  await withTempDir(async (dir) => {
    const meta: [string, GgufValue][] = [
      ["general.architecture", { type: "string", value: "qwen3" }],
      ["a.u32", { type: "u32", value: 4294967295 }],
      ["a.i32", { type: "i32", value: -7 }],
      ["a.u64", { type: "u64", value: 2n ** 40n + 3n }],
      ["a.f32", { type: "f32", value: 1e-6 }],
      ["a.bool", { type: "bool", value: true }],
      ["a.strs", { type: "string[]", value: ["Ġt", "h e", "", "<|im_end|>", "日本"] }],
      ["a.ints", { type: "i32[]", value: [1, -2, 3] }],
      ["a.floats", { type: "f32[]", value: [0.5, -1.25] }],
    ];
    const f32 = Float32Array.from([1, -2, 3.5, 1e-3, 7, 8]);
    const bf16 = new Uint8Array([1, 2, 3, 4, 5, 6]); // 3 values, odd size: padding follows
    const q8Values = Float32Array.from({ length: 64 }, (_, i) => Math.sin(i));
    const path = `${dir}/t.gguf`;
    const total = await writeGguf(path, meta, [
      { name: "w.f32", dims: [3, 2], type: "F32", data: () => new Uint8Array(f32.buffer) },
      { name: "w.bf16", dims: [3], type: "BF16", data: () => bf16 },
      { name: "w.q8", dims: [32, 2], type: "Q8_0", data: () => quantizeQ8_0(q8Values) },
      { name: "w.q4", dims: [32, 2], type: "Q4_0", data: () => quantizeQ4_0(q8Values) },
    ]);
    const bytes = await Deno.readFile(path);
    assert.equal(bytes.length, total);
    const g = parseGguf(bytes);
    assert.equal(g.version, 3);
    assert.equal(g.metadata.get("general.architecture")?.value, "qwen3");
    assert.equal(g.metadata.get("a.u32")?.value, 4294967295);
    assert.equal(g.metadata.get("a.i32")?.value, -7);
    assert.equal(g.metadata.get("a.u64")?.value, 2n ** 40n + 3n);
    assert.equal(g.metadata.get("a.f32")?.value, Math.fround(1e-6));
    assert.equal(g.metadata.get("a.bool")?.value, true);
    assert.deepEqual(g.metadata.get("a.strs")?.value, ["Ġt", "h e", "", "<|im_end|>", "日本"]);
    assert.deepEqual(g.metadata.get("a.ints")?.value, [1, -2, 3]);
    assert.deepEqual(g.metadata.get("a.floats")?.value, [0.5, -1.25]);
    assert.deepEqual([...g.metadata.keys()], meta.map(([k]) => k));
    const t = g.tensors.get("w.f32")!;
    assert.deepEqual(t.dims, [3n, 2n]);
    assert.equal(t.type, 0);
    assert.deepEqual(new Float32Array(t.data.slice().buffer), f32);
    assert.deepEqual(g.tensors.get("w.bf16")!.data, bf16);
    assert.equal(g.tensors.get("w.bf16")!.type, 30);
    assert.equal(g.tensors.get("w.q8")!.type, 8);
    assert.equal(g.tensors.get("w.q8")!.data.length, 68);
    assert.equal(g.tensors.get("w.q4")!.type, 2);
    assert.equal(g.tensors.get("w.q4")!.data.length, 36);
    assert.equal(g.dataStart % 32, 0);
  });
});

Deno.test("writeGguf() refuses data of the wrong length and leaves no file behind", async () => {
  await withTempDir(async (dir) => {
    await assert.rejects(
      writeGguf(`${dir}/bad.gguf`, [], [
        { name: "x", dims: [4], type: "F32", data: () => new Uint8Array(12) },
      ]),
      /16 expected/,
    );
    assert.deepEqual(await Array.fromAsync(Deno.readDir(dir)), []);
  });
});

/** float64 statement of Q8_0 for one block: returns dequantized values. */
function q8Reference(block: number[]): { scale: number; q: number[] } {
  const amax = Math.max(...block.map(Math.abs));
  const d = amax / 127;
  const scaleF16 = new DataView(new ArrayBuffer(2));
  scaleF16.setFloat16(0, d, true);
  const q = block.map((x) => {
    const v = d === 0 ? 0 : x / d;
    return Math.sign(v) * Math.floor(Math.abs(v) + 0.5);
  });
  return { scale: scaleF16.getFloat16(0, true), q };
}

Deno.test("quantizeQ8_0() stores an f16 scale of max/127 and rounded int8 values per 32-block", () => {
  const values = Float32Array.from(
    { length: 96 },
    (_, i) => Math.fround(Math.cos(i * 0.37) * (1 + (i >> 5))),
  );
  values.fill(0, 64, 96); // an all-zero block: scale 0, values 0
  const bytes = quantizeQ8_0(values);
  assert.equal(bytes.length, 3 * 34);
  const view = new DataView(bytes.buffer);
  for (let b = 0; b < 3; b++) {
    const block = [...values.subarray(b * 32, b * 32 + 32)];
    const ref = q8Reference(block);
    assert.equal(view.getFloat16(b * 34, true), ref.scale);
    for (let j = 0; j < 32; j++) {
      const q = view.getInt8(b * 34 + 2 + j);
      // float32 vs float64 arithmetic may differ only when x/d sits on a .5 boundary
      assert.ok(Math.abs(q - ref.q[j]) <= 1, `block ${b} value ${j}: ${q} vs ${ref.q[j]}`);
      if (ref.scale !== 0) assert.ok(Math.abs(q * ref.scale - block[j]) <= ref.scale * 0.51);
    }
    if (b < 2) {
      assert.equal(
        Math.max(...Array.from({ length: 32 }, (_, j) => Math.abs(view.getInt8(b * 34 + 2 + j)))),
        127,
      );
    }
  }
  assert.throws(() => quantizeQ8_0(new Float32Array(33)), /multiple of 32/);
});

Deno.test("quantizeQ4_0() stores an f16 scale of max/−8 and 4-bit codes (low nibble j, high j+16)", () => {
  const values = Float32Array.from(
    { length: 96 },
    (_, i) => Math.fround(Math.sin(i * 0.61) * (1 + (i >> 5))),
  );
  values.fill(0, 64, 96); // an all-zero block: scale 0, codes 8 (value 0)
  const bytes = quantizeQ4_0(values);
  assert.equal(bytes.length, 3 * 18);
  const view = new DataView(bytes.buffer);
  for (let b = 0; b < 3; b++) {
    const block = [...values.subarray(b * 32, b * 32 + 32)];
    // float64 statement: the signed value of largest magnitude maps to code 0 (−8·d)
    const max = block.reduce((m, x) => Math.abs(x) > Math.abs(m) ? x : m, 0);
    const d = max / -8;
    const h = new DataView(new ArrayBuffer(2));
    h.setFloat16(0, d, true);
    assert.equal(view.getFloat16(b * 18, true), h.getFloat16(0, true), `block ${b} scale`);
    for (let j = 0; j < 32; j++) {
      const byte = bytes[b * 18 + 2 + (j % 16)];
      const q = j < 16 ? byte & 15 : byte >> 4;
      const ref = d === 0 ? 8 : Math.min(15, Math.floor(block[j] / d + 8.5));
      // float32 vs float64 may differ only on a .5 boundary
      assert.ok(Math.abs(q - ref) <= 1, `block ${b} value ${j}: ${q} vs ${ref}`);
      // nearest level, except that code 15 (7·d) also takes values up to −8·d (clipped by ≤ |d|)
      const bound = Math.abs(d) * (q === 15 ? 1.01 : 0.51) + 1e-7;
      if (d !== 0) assert.ok(Math.abs((q - 8) * d - block[j]) <= bound, `block ${b} value ${j}`);
    }
  }
  assert.throws(() => quantizeQ4_0(new Float32Array(33)), /multiple of 32/);
});

Deno.test("f16Bits() rounds to nearest even and keeps specials", () => {
  assert.equal(f16Bits(1), 0x3c00);
  assert.equal(f16Bits(-2), 0xc000);
  assert.equal(f16Bits(65504), 0x7bff);
  assert.equal(f16Bits(1e6), 0x7c00);
  assert.equal(f16Bits(1 + 2 ** -11), 0x3c00); // halfway: even mantissa
  assert.equal(f16Bits(1 + 3 * 2 ** -11), 0x3c02);
  assert.equal(f16Bits(2 ** -24), 0x0001);
});
