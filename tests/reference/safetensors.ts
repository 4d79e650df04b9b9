// A tiny, independent safetensors reader for the float64 reference forward pass (tests only).
// Reads a whole file (or every shard named by model.safetensors.index.json) and decodes F32, F16
// and BF16 tensors to Float64Array exactly, bit by bit. It is NOT lib/model's reader and shares
// no code with it, so the oracle test compares two independent implementations.

/** One decoded tensor: row-major float64 values and the shape from the safetensors header. */
export interface Tensor64 {
  shape: number[];
  data: Float64Array;
}

/** Decodes an IEEE binary16 bit pattern (u16) to its exact float64 value. */
export function f16BitsToNumber(bits: number): number {
  const sign = (bits & 0x8000) !== 0 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const mantissa = bits & 0x3ff;
  if (exponent === 0) return sign * mantissa * 2 ** -24; // zero and subnormals: m · 2^-14 / 2^10
  if (exponent === 0x1f) return mantissa === 0 ? sign * Infinity : NaN;
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}

/** Decodes a bfloat16 bit pattern (u16: the top half of a float32) to its exact float64 value. */
export function bf16BitsToNumber(bits: number): number {
  const sign = (bits & 0x8000) !== 0 ? -1 : 1;
  const exponent = (bits >> 7) & 0xff;
  const mantissa = bits & 0x7f;
  if (exponent === 0) return sign * mantissa * 2 ** -133; // subnormals: m · 2^-126 / 2^7
  if (exponent === 0xff) return mantissa === 0 ? sign * Infinity : NaN;
  return sign * (1 + mantissa / 128) * 2 ** (exponent - 127);
}

const DTYPE_BYTES: Record<string, number> = { F32: 4, F16: 2, BF16: 2 };

/**
 * Reads every tensor of one .safetensors file, decoded to float64.
 * @param path file path
 * @returns map tensor name → {shape, data}
 * @throws Error on a malformed header, an unsupported dtype or offsets outside the file
 */
export async function readSafetensorsFile(path: string): Promise<Map<string, Tensor64>> {
  const bytes = await Deno.readFile(path);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.byteLength < 8) throw new Error(`${path}: ${bytes.byteLength} bytes, no header`);
  const headerLen = Number(view.getBigUint64(0, true));
  if (8 + headerLen > bytes.byteLength) {
    throw new Error(`${path}: header length ${headerLen} exceeds file size ${bytes.byteLength}`);
  }
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerLen)));
  const dataStart = 8 + headerLen;
  const out = new Map<string, Tensor64>();
  for (const [name, info] of Object.entries(header as Record<string, unknown>)) {
    if (name === "__metadata__") continue;
    const { dtype, shape, data_offsets } = info as {
      dtype: string;
      shape: number[];
      data_offsets: [number, number];
    };
    const size = DTYPE_BYTES[dtype];
    if (size === undefined) throw new Error(`${path}: ${name} has unsupported dtype ${dtype}`);
    const count = shape.reduce((a, b) => a * b, 1);
    const [begin, end] = data_offsets;
    if (end - begin !== count * size || dataStart + end > bytes.byteLength) {
      throw new Error(`${path}: ${name} offsets [${begin}, ${end}] bad for ${dtype}[${shape}]`);
    }
    const data = new Float64Array(count);
    const base = dataStart + begin;
    for (let i = 0; i < count; i++) {
      const at = base + i * size;
      if (dtype === "F32") data[i] = view.getFloat32(at, true); // float32 → float64 is exact
      else if (dtype === "F16") data[i] = f16BitsToNumber(view.getUint16(at, true));
      else data[i] = bf16BitsToNumber(view.getUint16(at, true));
    }
    out.set(name, { shape: [...shape], data });
  }
  return out;
}

/**
 * Reads all weights of a Hugging Face checkpoint directory: model.safetensors, or the shards
 * listed in model.safetensors.index.json ("weight_map": name → file).
 * @param dir checkpoint directory
 * @returns map tensor name → {shape, data}
 * @throws Error when a tensor listed in the index is missing from its shard
 */
export async function readCheckpointWeights(dir: string): Promise<Map<string, Tensor64>> {
  let indexText: string | null = null;
  try {
    indexText = await Deno.readTextFile(`${dir}/model.safetensors.index.json`);
  } catch (e) {
    if (!(e instanceof Deno.errors.NotFound)) throw e;
  }
  if (indexText === null) return await readSafetensorsFile(`${dir}/model.safetensors`);
  const weightMap = JSON.parse(indexText).weight_map as Record<string, string>;
  const all = new Map<string, Tensor64>();
  for (const file of new Set(Object.values(weightMap))) {
    for (const [name, t] of await readSafetensorsFile(`${dir}/${file}`)) all.set(name, t);
  }
  for (const [name, file] of Object.entries(weightMap)) {
    if (!all.has(name)) throw new Error(`${dir}: ${name} listed in the index but not in ${file}`);
  }
  return all;
}
