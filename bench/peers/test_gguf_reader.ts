// An independent GGUF v3 reader for tests of the writer (bench/peers/gguf.ts): parses header,
// metadata of every value type, tensor infos and data offsets straight from the bytes, following
// the GGUF spec (ggml docs/gguf.md), sharing no code with the writer. Tests only.

/** A parsed metadata value (arrays as JS arrays; 64-bit integers as bigint). */
export type ParsedValue = number | bigint | boolean | string | ParsedValue[];

/** One tensor's info and its bytes. */
export interface ParsedTensor {
  name: string;
  dims: bigint[];
  type: number;
  offset: bigint;
  data: Uint8Array;
}

/** A parsed GGUF file. */
export interface ParsedGguf {
  version: number;
  metadata: Map<string, { type: number; value: ParsedValue }>;
  tensors: Map<string, ParsedTensor>;
  dataStart: number;
}

const TYPE_SIZE: Record<number, [number, number]> = {
  0: [1, 4], // F32: 1 value per 4 bytes
  1: [1, 2], // F16
  30: [1, 2], // BF16
  8: [32, 34], // Q8_0: 32 values per 34 bytes
  2: [32, 18], // Q4_0: 32 values per 18 bytes
};

/**
 * Parses a GGUF file's bytes.
 * @param bytes the whole file
 * @returns header, metadata, tensors with their data slices
 * @throws Error on bad magic, an unknown value type or data outside the file
 */
export function parseGguf(bytes: Uint8Array): ParsedGguf {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let at = 0;
  const u32 = () => {
    const v = view.getUint32(at, true);
    at += 4;
    return v;
  };
  const u64 = () => {
    const v = view.getBigUint64(at, true);
    at += 8;
    return v;
  };
  const str = () => {
    const n = Number(u64());
    const s = new TextDecoder("utf-8", { fatal: true }).decode(bytes.subarray(at, at + n));
    at += n;
    return s;
  };
  const value = (type: number): ParsedValue => {
    switch (type) {
      case 0:
        return view.getUint8(at++);
      case 1:
        return view.getInt8(at++);
      case 2:
        at += 2;
        return view.getUint16(at - 2, true);
      case 3:
        at += 2;
        return view.getInt16(at - 2, true);
      case 4:
        return u32();
      case 5:
        at += 4;
        return view.getInt32(at - 4, true);
      case 6:
        at += 4;
        return view.getFloat32(at - 4, true);
      case 7:
        return view.getUint8(at++) !== 0;
      case 8:
        return str();
      case 9: {
        const elemType = u32();
        const n = Number(u64());
        const out: ParsedValue[] = [];
        for (let i = 0; i < n; i++) out.push(value(elemType));
        return out;
      }
      case 10:
        return u64();
      case 11:
        at += 8;
        return view.getBigInt64(at - 8, true);
      case 12:
        at += 8;
        return view.getFloat64(at - 8, true);
      default:
        throw new Error(`unknown GGUF value type ${type} at byte ${at}`);
    }
  };
  if (u32() !== 0x46554747) throw new Error("bad magic");
  const version = u32();
  const nTensors = Number(u64());
  const nKv = Number(u64());
  const metadata = new Map<string, { type: number; value: ParsedValue }>();
  for (let i = 0; i < nKv; i++) {
    const key = str();
    const type = u32();
    metadata.set(key, { type, value: value(type) });
  }
  const infos: Omit<ParsedTensor, "data">[] = [];
  for (let i = 0; i < nTensors; i++) {
    const name = str();
    const nDims = u32();
    const dims: bigint[] = [];
    for (let d = 0; d < nDims; d++) dims.push(u64());
    infos.push({ name, dims, type: u32(), offset: u64() });
  }
  const alignment = Number(metadata.get("general.alignment")?.value ?? 32);
  const dataStart = Math.ceil(at / alignment) * alignment;
  const tensors = new Map<string, ParsedTensor>();
  for (const t of infos) {
    const [per, size] = TYPE_SIZE[t.type] ?? [];
    if (per === undefined) throw new Error(`tensor ${t.name}: unknown type ${t.type}`);
    const count = t.dims.reduce((a, b) => a * b, 1n);
    const nbytes = Number(count) / per * size;
    const begin = dataStart + Number(t.offset);
    if (Number(t.offset) % alignment !== 0) throw new Error(`${t.name}: unaligned offset`);
    if (begin + nbytes > bytes.length) throw new Error(`${t.name}: data outside the file`);
    tensors.set(t.name, { ...t, data: bytes.subarray(begin, begin + nbytes) });
  }
  return { version, metadata, tensors, dataStart };
}
