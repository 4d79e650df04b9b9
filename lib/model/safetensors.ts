// safetensors files: header reading (treating the file as hostile), byte-range reads of one
// tensor, and an encoder for small files (tests, projector weights). Layout: u64 LE header length
// N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, __metadata__?}, then the
// data region; data_offsets are relative to byte 8 + N. Only F32/F16/BF16 are accepted.

import { ModelFormatError, quote } from "./errors.ts";

/** Tensor element types the engine reads. */
export type SafetensorsDtype = "F32" | "F16" | "BF16";

/** One tensor of a safetensors file, with its absolute byte range in that file. */
export interface TensorInfo {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  /** path of the file holding the bytes */
  file: string;
  /** absolute byte offset in `file`: 8 + header length + data_offsets[0] */
  offset: number;
  /** bytes: product(shape) × element size */
  nbytes: number;
}

/** Largest JSON header accepted (bytes). */
export const MAX_HEADER_BYTES = 100 * 1024 * 1024;

const DTYPE_SIZE: Record<SafetensorsDtype, number> = { F32: 4, F16: 2, BF16: 2 };

/**
 * Element size of a safetensors dtype in bytes.
 * @param dtype "F32" | "F16" | "BF16"
 * @returns 4 or 2
 */
export function safetensorsDtypeSize(dtype: SafetensorsDtype): number {
  return DTYPE_SIZE[dtype];
}

async function readExactly(file: Deno.FsFile, buf: Uint8Array, path: string): Promise<void> {
  let got = 0;
  while (got < buf.length) {
    const n = await file.read(buf.subarray(got));
    if (n === null) {
      throw new ModelFormatError(`truncated: expected ${buf.length} bytes, read ${got}`, path);
    }
    got += n;
  }
}

function checkedProduct(shape: number[]): number | null {
  let p = 1;
  for (const d of shape) {
    p *= d;
    if (!Number.isSafeInteger(p)) return null;
  }
  return p;
}

/**
 * Reads and validates the header of a safetensors file without reading tensor data.
 * Checks: header length ≤ 100 MB and ≤ file size − 8; valid UTF-8 JSON object; every entry has a
 * supported dtype, a shape of safe non-negative integers and data_offsets [begin ≤ end]; bytes
 * match product(shape) × element size; ranges lie in the data region and do not overlap.
 * @param path the .safetensors file
 * @returns tensors sorted by offset, the header length N and the file size (bytes)
 * @throws ModelFormatError quoting the offending name/value on any violation or read failure
 */
export async function readSafetensorsHeader(
  path: string,
): Promise<{ tensors: TensorInfo[]; headerBytes: number; fileSize: number }> {
  let file: Deno.FsFile;
  try {
    file = await Deno.open(path, { read: true });
  } catch (e) {
    throw new ModelFormatError(`cannot open: ${(e as Error).message}`, path);
  }
  let headerText: string;
  let fileSize: number;
  let headerBytes: number;
  try {
    const info = await file.stat();
    if (!info.isFile) throw new ModelFormatError(`not a regular file`, path);
    fileSize = info.size;
    if (fileSize < 8) {
      throw new ModelFormatError(`truncated: file has ${fileSize} bytes, needs at least 8`, path);
    }
    const lenBuf = new Uint8Array(8);
    await readExactly(file, lenBuf, path);
    const n = new DataView(lenBuf.buffer).getBigUint64(0, true);
    if (n > BigInt(MAX_HEADER_BYTES)) {
      throw new ModelFormatError(
        `header length ${n} exceeds the ${MAX_HEADER_BYTES}-byte limit`,
        path,
      );
    }
    headerBytes = Number(n);
    if (headerBytes > fileSize - 8) {
      throw new ModelFormatError(
        `truncated: header length ${headerBytes} exceeds the ${
          fileSize - 8
        } bytes after the length prefix`,
        path,
      );
    }
    const buf = new Uint8Array(headerBytes);
    await readExactly(file, buf, path);
    try {
      headerText = new TextDecoder("utf-8", { fatal: true }).decode(buf);
    } catch {
      throw new ModelFormatError(`header is not valid UTF-8`, path);
    }
  } finally {
    file.close();
  }

  let header: unknown;
  try {
    header = JSON.parse(headerText);
  } catch (e) {
    throw new ModelFormatError(`header is not valid JSON: ${(e as Error).message}`, path);
  }
  if (header === null || typeof header !== "object" || Array.isArray(header)) {
    throw new ModelFormatError(`header must be a JSON object, got ${quote(header)}`, path);
  }

  const dataStart = 8 + headerBytes;
  const dataSize = fileSize - dataStart;
  const tensors: (TensorInfo & { begin: number; end: number })[] = [];
  for (const [name, entry] of Object.entries(header as Record<string, unknown>)) {
    if (name === "__metadata__") {
      if (entry !== null && (typeof entry !== "object" || Array.isArray(entry))) {
        throw new ModelFormatError(`__metadata__ must be an object, got ${quote(entry)}`, path);
      }
      continue;
    }
    const where = `tensor ${quote(name)}`;
    if (name.length === 0) throw new ModelFormatError(`empty tensor name`, path);
    if (entry === null || typeof entry !== "object" || Array.isArray(entry)) {
      throw new ModelFormatError(`${where}: entry must be an object, got ${quote(entry)}`, path);
    }
    const { dtype, shape, data_offsets: offsets } = entry as Record<string, unknown>;
    if (typeof dtype !== "string") {
      throw new ModelFormatError(`${where}: dtype must be a string, got ${quote(dtype)}`, path);
    }
    if (!(dtype in DTYPE_SIZE)) {
      throw new ModelFormatError(
        `${where}: unsupported dtype ${quote(dtype)} (supported: F32, F16, BF16)`,
        path,
      );
    }
    if (
      !Array.isArray(shape) || shape.length > 8 ||
      !shape.every((d) => Number.isSafeInteger(d) && d >= 0)
    ) {
      throw new ModelFormatError(
        `${where}: shape must be an array of at most 8 non-negative integers, got ${quote(shape)}`,
        path,
      );
    }
    if (
      !Array.isArray(offsets) || offsets.length !== 2 ||
      !offsets.every((o) => Number.isSafeInteger(o) && o >= 0) || offsets[0] > offsets[1]
    ) {
      throw new ModelFormatError(
        `${where}: data_offsets must be [begin, end] integers with 0 <= begin <= end, got ${
          quote(offsets)
        }`,
        path,
      );
    }
    const [begin, end] = offsets as [number, number];
    if (end > dataSize) {
      throw new ModelFormatError(
        `${where}: data_offsets ${quote(offsets)} extend past the data region (${dataSize} bytes)`,
        path,
      );
    }
    const size = DTYPE_SIZE[dtype as SafetensorsDtype];
    const elems = checkedProduct(shape as number[]);
    if (elems === null || elems * size !== end - begin) {
      throw new ModelFormatError(
        `${where}: shape ${quote(shape)} × ${size} bytes (${dtype}) does not match data_offsets ${
          quote(offsets)
        } (${end - begin} bytes)`,
        path,
      );
    }
    tensors.push({
      name,
      dtype: dtype as SafetensorsDtype,
      shape: [...(shape as number[])],
      file: path,
      offset: dataStart + begin,
      nbytes: end - begin,
      begin,
      end,
    });
  }
  tensors.sort((a, b) => a.begin - b.begin || a.end - b.end);
  for (let i = 1; i < tensors.length; i++) {
    const prev = tensors[i - 1], cur = tensors[i];
    if (cur.begin < prev.end) {
      throw new ModelFormatError(
        `tensors ${quote(prev.name)} [${prev.begin}, ${prev.end}) and ${
          quote(cur.name)
        } [${cur.begin}, ${cur.end}) overlap`,
        path,
      );
    }
  }
  return {
    tensors: tensors.map(({ begin: _b, end: _e, ...t }) => t),
    headerBytes,
    fileSize,
  };
}

/**
 * Reads bytes [begin, end) of one tensor from its file (not the whole file).
 * @param info the tensor (from readSafetensorsHeader)
 * @param begin first byte, relative to the tensor (default 0)
 * @param end one past the last byte, relative to the tensor (default info.nbytes)
 * @returns the bytes
 * @throws RangeError for a range outside the tensor; ModelFormatError when the file is short
 */
export async function readTensorBytes(
  info: TensorInfo,
  begin = 0,
  end = info.nbytes,
): Promise<Uint8Array> {
  if (!Number.isSafeInteger(begin) || !Number.isSafeInteger(end) || begin < 0 || end < begin) {
    throw new RangeError(`invalid byte range [${begin}, ${end}) for tensor ${quote(info.name)}`);
  }
  if (end > info.nbytes) {
    throw new RangeError(
      `byte range [${begin}, ${end}) exceeds tensor ${quote(info.name)} (${info.nbytes} bytes)`,
    );
  }
  const file = await Deno.open(info.file, { read: true });
  try {
    await file.seek(info.offset + begin, Deno.SeekMode.Start);
    const buf = new Uint8Array(end - begin);
    await readExactly(file, buf, info.file);
    return buf;
  } finally {
    file.close();
  }
}

/** One tensor to encode. */
export interface SafetensorsEntry {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  /** raw little-endian bytes, product(shape) × element size long */
  data: Uint8Array;
}

/**
 * Encodes tensors as a safetensors file (data in the given order; header padded with spaces to a
 * multiple of 8 bytes).
 * @param entries tensors with their raw bytes
 * @param metadata optional string map stored as __metadata__
 * @returns the file's bytes
 * @throws RangeError when a tensor's byte length does not match its shape and dtype
 */
export function encodeSafetensors(
  entries: SafetensorsEntry[],
  metadata?: Record<string, string>,
): Uint8Array {
  const header: Record<string, unknown> = {};
  if (metadata) header.__metadata__ = metadata;
  let pos = 0;
  for (const e of entries) {
    const want = e.shape.reduce((a, b) => a * b, 1) * DTYPE_SIZE[e.dtype];
    if (want !== e.data.length) {
      throw new RangeError(
        `tensor ${quote(e.name)}: shape ${
          quote(e.shape)
        } ${e.dtype} needs ${want} bytes, got ${e.data.length}`,
      );
    }
    header[e.name] = { dtype: e.dtype, shape: e.shape, data_offsets: [pos, pos + e.data.length] };
    pos += e.data.length;
  }
  let json = new TextEncoder().encode(JSON.stringify(header));
  const padded = Math.ceil(json.length / 8) * 8;
  if (padded !== json.length) {
    const p = new Uint8Array(padded).fill(0x20);
    p.set(json);
    json = p;
  }
  const out = new Uint8Array(8 + json.length + pos);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  let o = 8 + json.length;
  for (const e of entries) {
    out.set(e.data, o);
    o += e.data.length;
  }
  return out;
}
