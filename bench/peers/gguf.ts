// A small GGUF (v3) writer for the peer benchmark: typed metadata key/values, tensor infos and
// tensor data (F32, F16, BF16, Q8_0, Q4_0), streamed to a file one tensor at a time so a multi-GB model
// never sits in memory. It writes what llama.cpp reads; it is not a general GGUF library (no
// reader here: the test has its own, independent one).

/** ggml tensor types this writer produces (ggml.h `enum ggml_type`). */
export const GGML_TYPE = { F32: 0, F16: 1, Q4_0: 2, Q8_0: 8, BF16: 30 } as const;
/** A ggml tensor type name. */
export type GgmlTypeName = keyof typeof GGML_TYPE;

/** GGUF metadata value types (gguf.h `enum gguf_type`). */
export const GGUF_VALUE = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;

/** One metadata value: scalars carry their GGUF type; arrays hold one element type. */
export type GgufValue =
  | { type: "u32"; value: number }
  | { type: "i32"; value: number }
  | { type: "u64"; value: bigint }
  | { type: "f32"; value: number }
  | { type: "bool"; value: boolean }
  | { type: "string"; value: string }
  | { type: "string[]"; value: string[] }
  | { type: "i32[]"; value: ArrayLike<number> }
  | { type: "f32[]"; value: ArrayLike<number> };

/** A tensor to write: ggml dims (ne0 first: the contiguous dimension), type and its bytes. */
export interface GgufTensor {
  name: string;
  /** ggml order: dims[0] is the innermost (row length); HF shape reversed */
  dims: number[];
  type: GgmlTypeName;
  /** produces exactly ggufTensorBytes(dims, type) bytes; called once, in file order */
  data: () => Promise<Uint8Array> | Uint8Array;
}

/** Q8_0: blocks of 32 values, each an f16 scale + 32 int8 (34 bytes). */
export const Q8_0_BLOCK = 32;
const Q8_0_BYTES = 34;
/** Q4_0: blocks of 32 values, each an f16 scale + 16 bytes of 4-bit codes (18 bytes). */
const Q4_0_BYTES = 18;

/**
 * Bytes a tensor of these dims and type takes.
 * @param dims ggml dims (ne0 first)
 * @param type tensor type
 * @returns byte count
 * @throws RangeError when Q8_0 / Q4_0 rows are not a multiple of 32 values
 */
export function ggufTensorBytes(dims: number[], type: GgmlTypeName): number {
  const n = dims.reduce((a, b) => a * b, 1);
  if (type === "F32") return 4 * n;
  if (type === "F16" || type === "BF16") return 2 * n;
  if (dims[0] % Q8_0_BLOCK !== 0) {
    throw new RangeError(`${type} needs rows of a multiple of 32 values, got ${dims[0]}`);
  }
  return (n / Q8_0_BLOCK) * (type === "Q4_0" ? Q4_0_BYTES : Q8_0_BYTES);
}

const ALIGNMENT = 32; // general.alignment default; tensor data offsets are multiples of it

/** Little-endian byte sink that grows as needed (for the header). */
class ByteWriter {
  #buf = new Uint8Array(1 << 16);
  #view = new DataView(this.#buf.buffer);
  length = 0;

  #reserve(n: number) {
    if (this.length + n <= this.#buf.length) return;
    let size = this.#buf.length * 2;
    while (size < this.length + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.#buf.subarray(0, this.length));
    this.#buf = next;
    this.#view = new DataView(next.buffer);
  }
  u8(x: number) {
    this.#reserve(1);
    this.#view.setUint8(this.length, x);
    this.length += 1;
  }
  u32(x: number) {
    this.#reserve(4);
    this.#view.setUint32(this.length, x, true);
    this.length += 4;
  }
  i32(x: number) {
    this.#reserve(4);
    this.#view.setInt32(this.length, x, true);
    this.length += 4;
  }
  u64(x: bigint | number) {
    this.#reserve(8);
    this.#view.setBigUint64(this.length, BigInt(x), true);
    this.length += 8;
  }
  f32(x: number) {
    this.#reserve(4);
    this.#view.setFloat32(this.length, x, true);
    this.length += 4;
  }
  bytes(b: Uint8Array) {
    this.#reserve(b.length);
    this.#buf.set(b, this.length);
    this.length += b.length;
  }
  string(s: string) {
    const b = new TextEncoder().encode(s);
    this.u64(b.length);
    this.bytes(b);
  }
  pad(alignment: number) {
    while (this.length % alignment !== 0) this.u8(0);
  }
  result(): Uint8Array {
    return this.#buf.subarray(0, this.length);
  }
}

function writeValue(w: ByteWriter, v: GgufValue) {
  switch (v.type) {
    case "u32":
      w.u32(GGUF_VALUE.UINT32);
      return w.u32(v.value);
    case "i32":
      w.u32(GGUF_VALUE.INT32);
      return w.i32(v.value);
    case "u64":
      w.u32(GGUF_VALUE.UINT64);
      return w.u64(v.value);
    case "f32":
      w.u32(GGUF_VALUE.FLOAT32);
      return w.f32(v.value);
    case "bool":
      w.u32(GGUF_VALUE.BOOL);
      return w.u8(v.value ? 1 : 0);
    case "string":
      w.u32(GGUF_VALUE.STRING);
      return w.string(v.value);
    case "string[]":
      w.u32(GGUF_VALUE.ARRAY);
      w.u32(GGUF_VALUE.STRING);
      w.u64(v.value.length);
      for (const s of v.value) w.string(s);
      return;
    case "i32[]":
      w.u32(GGUF_VALUE.ARRAY);
      w.u32(GGUF_VALUE.INT32);
      w.u64(v.value.length);
      for (let i = 0; i < v.value.length; i++) w.i32(v.value[i]);
      return;
    case "f32[]":
      w.u32(GGUF_VALUE.ARRAY);
      w.u32(GGUF_VALUE.FLOAT32);
      w.u64(v.value.length);
      for (let i = 0; i < v.value.length; i++) w.f32(v.value[i]);
      return;
  }
}

/**
 * Writes a GGUF v3 file: header, metadata (in the given order), tensor infos, then each tensor's
 * data at a 32-byte aligned offset. The file appears under `path` only when complete.
 * @param path output file
 * @param metadata key → value, in order
 * @param tensors tensors in file order
 * @returns total bytes written
 * @throws RangeError when a tensor's data has the wrong length or a name repeats
 */
export async function writeGguf(
  path: string,
  metadata: [string, GgufValue][],
  tensors: GgufTensor[],
): Promise<number> {
  const names = new Set<string>();
  const w = new ByteWriter();
  w.u32(0x46554747); // "GGUF"
  w.u32(3);
  w.u64(tensors.length);
  w.u64(metadata.length);
  for (const [key, value] of metadata) {
    w.string(key);
    writeValue(w, value);
  }
  let offset = 0;
  const sizes: number[] = [];
  for (const t of tensors) {
    if (names.has(t.name)) throw new RangeError(`tensor "${t.name}" written twice`);
    names.add(t.name);
    w.string(t.name);
    w.u32(t.dims.length);
    for (const d of t.dims) w.u64(d);
    w.u32(GGML_TYPE[t.type]);
    w.u64(offset);
    const size = ggufTensorBytes(t.dims, t.type);
    sizes.push(size);
    offset += Math.ceil(size / ALIGNMENT) * ALIGNMENT;
  }
  w.pad(ALIGNMENT);
  const tmp = `${path}.partial`;
  const file = await Deno.open(tmp, { write: true, create: true, truncate: true });
  let total = 0;
  const put = async (bytes: Uint8Array) => {
    for (let at = 0; at < bytes.length;) at += await file.write(bytes.subarray(at));
    total += bytes.length;
  };
  try {
    await put(w.result());
    for (let i = 0; i < tensors.length; i++) {
      const bytes = await tensors[i].data();
      if (bytes.length !== sizes[i]) {
        throw new RangeError(
          `tensor "${tensors[i].name}": ${bytes.length} bytes, ${sizes[i]} expected`,
        );
      }
      await put(bytes);
      const pad = Math.ceil(sizes[i] / ALIGNMENT) * ALIGNMENT - sizes[i];
      if (pad > 0) await put(new Uint8Array(pad));
    }
  } catch (e) {
    file.close();
    await Deno.remove(tmp).catch(() => {});
    throw e;
  }
  file.close();
  await Deno.rename(tmp, path);
  return total;
}

/** float32 → IEEE binary16 bits, round to nearest even (as ggml's F32→F16). */
export function f16Bits(x: number): number {
  const f = new DataView(new ArrayBuffer(2));
  f.setFloat16(0, x, true);
  return f.getUint16(0, true);
}

/**
 * Quantizes float32 rows to Q8_0 exactly as ggml's quantize_row_q8_0_ref: per block of 32,
 * d = max|x| / 127 (float32), q = roundf(x · (1/d)) (half away from zero), d stored as f16.
 * @param x values, length a multiple of 32
 * @returns Q8_0 bytes
 */
export function quantizeQ8_0(x: Float32Array): Uint8Array {
  if (x.length % Q8_0_BLOCK !== 0) {
    throw new RangeError(`Q8_0 needs a multiple of 32 values, got ${x.length}`);
  }
  const nb = x.length / Q8_0_BLOCK;
  const out = new Uint8Array(nb * Q8_0_BYTES);
  const view = new DataView(out.buffer);
  const f = Math.fround;
  for (let b = 0; b < nb; b++) {
    const base = b * Q8_0_BLOCK;
    let amax = 0;
    for (let j = 0; j < Q8_0_BLOCK; j++) amax = Math.max(amax, Math.abs(x[base + j]));
    const d = f(amax / 127);
    const id = d !== 0 ? f(1 / d) : 0;
    view.setFloat16(b * Q8_0_BYTES, d, true);
    for (let j = 0; j < Q8_0_BLOCK; j++) {
      const v = f(x[base + j] * id);
      const q = Math.sign(v) * Math.floor(Math.abs(v) + 0.5); // C roundf
      view.setInt8(b * Q8_0_BYTES + 2 + j, q);
    }
  }
  return out;
}

/**
 * Quantizes float32 rows to Q4_0 exactly as ggml's quantize_row_q4_0_ref: per block of 32, the
 * value of largest magnitude `max` gives d = max / −8 (float32), q = min(15, trunc(x·(1/d) + 8.5)),
 * d stored as f16; byte j holds q[j] in its low nibble and q[j + 16] in its high one.
 * @param x values, length a multiple of 32
 * @returns Q4_0 bytes
 */
export function quantizeQ4_0(x: Float32Array): Uint8Array {
  if (x.length % Q8_0_BLOCK !== 0) {
    throw new RangeError(`Q4_0 needs a multiple of 32 values, got ${x.length}`);
  }
  const nb = x.length / Q8_0_BLOCK;
  const out = new Uint8Array(nb * Q4_0_BYTES);
  const view = new DataView(out.buffer);
  const f = Math.fround;
  for (let b = 0; b < nb; b++) {
    const base = b * Q8_0_BLOCK;
    let amax = 0, max = 0;
    for (let j = 0; j < Q8_0_BLOCK; j++) {
      const v = x[base + j];
      if (amax < Math.abs(v)) {
        amax = Math.abs(v);
        max = v;
      }
    }
    const d = f(max / -8);
    const id = d !== 0 ? f(1 / d) : 0;
    view.setFloat16(b * Q4_0_BYTES, d, true);
    const code = (v: number) => Math.min(15, Math.trunc(f(f(v * id) + 8.5))); // (int8_t) cast
    for (let j = 0; j < 16; j++) {
      out[b * Q4_0_BYTES + 2 + j] = code(x[base + j]) | (code(x[base + 16 + j]) << 4);
    }
  }
  return out;
}
