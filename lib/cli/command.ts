// What a CLI command is, the usage error, and every option shared by two or more commands: each
// shared flag is declared once in an option group below and parsed once by that group's parser.
// Flags only one command takes stay in that command's file. No model loading here (model_pair.ts).

import { parseArgs, type ParseArgsConfig } from "node:util";
import {
  BACKEND_CHOICES,
  type BackendChoice,
  type KvDtype,
  type NativeModelOptions,
  WEIGHT_FORMATS,
  type WeightFormat,
} from "../native/mod.ts";
import { MAX_SEQUENCE_TOKENS } from "../engine/mod.ts";

/** One `deno task cli <name>` command. */
export interface CliCommand {
  /** One line for the command list. */
  summary: string;
  /** Full usage text (printed by --help and on usage errors). */
  usage: string;
  /**
   * Runs the command: results to stdout, nothing else there.
   * @param args the arguments after the command name
   * @returns the process exit code
   */
  run(args: string[]): Promise<number>;
}

/** The command line is wrong (unknown option, missing or malformed value): exit code 2. */
export class UsageError extends Error {
  /**
   * @param message what is wrong, quoting the offending value
   */
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

// ---- option groups (spread into a command's parseOptions table) ----

/** --threads N (CPU threads, 0 = all cores), --kv-dtype D, --weights W (bf16|q8|q4), --backend B
 *  (auto|cpu|cuda) and --device N (CUDA ordinal); parsed by parseModelLoadOptions. */
export const modelLoadOptions = {
  threads: { type: "string" },
  "kv-dtype": { type: "string" },
  weights: { type: "string" },
  backend: { type: "string" },
  device: { type: "string" },
} as const satisfies ParseArgsConfig["options"];

/** Usage lines of modelLoadOptions' backend flags, for each command's usage text. */
export const BACKEND_USAGE =
  `  --backend B          auto | cpu | cuda (default auto: CUDA when a device answers, else CPU)
  --device N           CUDA device ordinal (default 0)
  --weights W          bf16 (as stored) | q8 (8-bit, per-32 block scales) | q4 (4-bit, per-32
                       scale + offset); q8/q4 CPU only`;

/** Commands that load one model: --model DIR (read with requireString) + modelLoadOptions. */
export const modelOptions = {
  model: { type: "string" },
  ...modelLoadOptions,
} as const satisfies ParseArgsConfig["options"];

/** Commands that load two models: --source DIR, --target DIR + modelLoadOptions. */
export const pairOptions = {
  source: { type: "string" },
  target: { type: "string" },
  ...modelLoadOptions,
} as const satisfies ParseArgsConfig["options"];

/** pairOptions + --projector DIR (optional). --source/--target/--projector: parsePairOptions. */
export const migrationOptions = {
  ...pairOptions,
  projector: { type: "string" },
} as const satisfies ParseArgsConfig["options"];

/** Sampling flags; parsed by parseSamplingOptions. Commands taking a subset use pick(). */
export const samplingOptions = {
  "max-tokens": { type: "string" },
  temperature: { type: "string" },
  "top-k": { type: "string" },
  "top-p": { type: "string" },
  "min-p": { type: "string" },
  "repetition-penalty": { type: "string" },
  seed: { type: "string" },
  stop: { type: "string", multiple: true },
} as const satisfies ParseArgsConfig["options"];

/** --key-id ID and --key-file F (HMAC key for signing or verifying); read by readKeyOptions. */
export const keyOptions = {
  "key-id": { type: "string" },
  "key-file": { type: "string" },
} as const satisfies ParseArgsConfig["options"];

/**
 * The named entries of an option group, for a command that takes only some of its flags.
 *
 * @param group an option group, e.g. samplingOptions
 * @param names the flags to keep
 * @returns a new table with just those entries
 */
export function pick<T extends object, K extends keyof T>(group: T, names: K[]): Pick<T, K> {
  const out = {} as Pick<T, K>;
  for (const name of names) out[name] = group[name];
  return out;
}

// ---- parsing ----

/**
 * node:util parseArgs with strict checking, its errors turned into UsageError.
 *
 * @param args command arguments
 * @param options parseArgs option table (always gets `help`)
 * @returns parsed values
 * @throws {UsageError} for unknown options, missing values, or positionals
 */
export function parseOptions<T extends NonNullable<ParseArgsConfig["options"]>>(
  args: string[],
  options: T,
) {
  // `--temperature -1` is a value, not an option: pass it as `--temperature=-1` so the value's
  // own check answers (parseArgs would call it ambiguous).
  const joined: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const name = /^--([^=]+)$/.exec(args[i])?.[1];
    if (
      name !== undefined && options[name]?.type === "string" && i + 1 < args.length &&
      /^-(\d|\.\d)/.test(args[i + 1])
    ) {
      joined.push(`${args[i]}=${args[++i]}`);
    } else joined.push(args[i]);
  }
  try {
    return parseArgs({
      args: joined,
      options: { ...options, help: { type: "boolean" } },
      strict: true,
      allowPositionals: false,
    })
      .values;
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
}

/**
 * Reads a required string option.
 *
 * @param value the parsed value
 * @param flag the flag name, for the message
 * @returns the value
 * @throws {UsageError} when absent or empty
 */
export function requireString(value: unknown, flag: string): string {
  if (typeof value !== "string" || value.length === 0) {
    throw new UsageError(`--${flag} is required`);
  }
  return value;
}

/**
 * Parses an optional numeric option.
 *
 * @param value the parsed string, or undefined
 * @param flag flag name for messages
 * @param kind "int" for integers, "float" for any finite number
 * @param range inclusive bounds; `above` is an exclusive lower bound
 * @returns the number, or undefined when the option was not given
 * @throws {UsageError} when the text is not such a number or lies outside the range
 */
export function parseNumber(
  value: unknown,
  flag: string,
  kind: "int" | "float",
  range: { min?: number; above?: number; max?: number } = {},
): number | undefined {
  if (value === undefined) return undefined;
  const text = String(value).trim();
  const n = Number(text);
  if (text.length === 0 || !Number.isFinite(n) || (kind === "int" && !Number.isSafeInteger(n))) {
    throw new UsageError(
      `--${flag} must be ${kind === "int" ? "an integer" : "a number"}, got ${
        JSON.stringify(value)
      }`,
    );
  }
  const { min, above, max } = range;
  if (
    (min !== undefined && n < min) || (above !== undefined && n <= above) ||
    (max !== undefined && n > max)
  ) {
    const lower = min !== undefined ? `[${min}` : above !== undefined ? `(${above}` : "(-inf";
    throw new UsageError(
      `--${flag} must be in ${lower}, ${max ?? "inf"}], got ${JSON.stringify(value)}`,
    );
  }
  return n;
}

/**
 * Parses a comma-separated list of repair lengths (--repair, --eval-repair).
 *
 * @param text e.g. "1,8,32"
 * @param flag flag name for messages
 * @returns the lengths
 * @throws {UsageError} for anything but positive integers
 */
export function parseRepairList(text: string, flag: string): number[] {
  const rs = text.split(",").map((s) => s.trim());
  return rs.map((s) => {
    const n = Number(s);
    if (s === "" || !Number.isSafeInteger(n) || n < 1) {
      throw new UsageError(`--${flag}: ${JSON.stringify(s)} is not an integer >= 1`);
    }
    return n;
  });
}

/**
 * Native options from modelLoadOptions (--threads, --kv-dtype, --weights, --backend, --device).
 *
 * @param values parsed values holding `threads`, `kv-dtype`, `weights`, `backend` and `device`
 * @returns NativeModelOptions (threads 0 = all cores; kvDtype default f32; backend default auto,
 *   whose CPU fallback is logged only when --backend auto was given)
 * @throws {UsageError} for a bad thread count, an unknown dtype or backend, or a bad device
 */
export function parseModelLoadOptions(
  values: {
    threads?: unknown;
    "kv-dtype"?: unknown;
    weights?: unknown;
    backend?: unknown;
    device?: unknown;
  },
): NativeModelOptions {
  const threads = parseNumber(values.threads, "threads", "int");
  if (threads !== undefined && threads < 0) {
    throw new UsageError(`--threads must be >= 0, got ${threads}`);
  }
  const kv = values["kv-dtype"];
  if (kv !== undefined && kv !== "f32" && kv !== "f16" && kv !== "bf16") {
    throw new UsageError(`--kv-dtype must be f32, f16 or bf16, got ${JSON.stringify(kv)}`);
  }
  const weights = values.weights;
  if (weights !== undefined && !(WEIGHT_FORMATS as readonly unknown[]).includes(weights)) {
    throw new UsageError(
      `--weights must be ${WEIGHT_FORMATS.slice(0, -1).join(", ")} or ${
        WEIGHT_FORMATS.at(-1)
      }, got ${JSON.stringify(weights)}`,
    );
  }
  const backend = values.backend ?? "auto";
  if (typeof backend !== "string" || !(BACKEND_CHOICES as readonly string[]).includes(backend)) {
    throw new UsageError(`--backend must be auto, cpu or cuda, got ${JSON.stringify(backend)}`);
  }
  const device = parseNumber(values.device, "device", "int", { min: 0, max: 0x7fffffff });
  return {
    threads,
    kvDtype: kv as KvDtype | undefined,
    weights: weights as WeightFormat | undefined,
    backend: backend as BackendChoice,
    device,
    // the implicit default says nothing when it lands on the CPU; an explicit --backend auto does
    logAutoFallback: values.backend !== undefined,
  };
}

/** Checkpoint and projector directories from pairOptions / migrationOptions. */
export interface PairDirs {
  sourceDir: string;
  targetDir: string;
  /** --projector; undefined when not given (or the command has no such flag). */
  projectorDir?: string;
}

/**
 * Reads --source and --target (required) and --projector (optional).
 *
 * @param values parsed values holding `source`, `target` and maybe `projector`
 * @returns the directories (not checked for existence: loading does that)
 * @throws {UsageError} when --source or --target is absent or empty
 */
export function parsePairOptions(
  values: { source?: unknown; target?: unknown; projector?: unknown },
): PairDirs {
  return {
    sourceDir: requireString(values.source, "source"),
    targetDir: requireString(values.target, "target"),
    projectorDir: typeof values.projector === "string" ? values.projector : undefined,
  };
}

/** Sampling flags as given; undefined = not given (each command applies its own defaults). */
export interface SamplingFlags {
  maxTokens?: number;
  temperature?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  repetitionPenalty?: number;
  seed?: number;
  stop?: string[];
}

/**
 * Parses samplingOptions (or the subset a command took). Only the number syntax is checked here;
 * ranges (e.g. top-p in (0, 1]) are the engine's RangeErrors.
 *
 * @param values parsed values holding any of the samplingOptions flags
 * @returns the numbers and stop strings, undefined where a flag was not given
 * @throws {UsageError} for a malformed number, quoting it
 */
export function parseSamplingOptions(values: {
  "max-tokens"?: unknown;
  temperature?: unknown;
  "top-k"?: unknown;
  "top-p"?: unknown;
  "min-p"?: unknown;
  "repetition-penalty"?: unknown;
  seed?: unknown;
  stop?: string[];
}): SamplingFlags {
  return {
    // The same bounds the HTTP API enforces; seeds are 32-bit like OpenAI's.
    maxTokens: parseNumber(values["max-tokens"], "max-tokens", "int", {
      min: 1,
      max: MAX_SEQUENCE_TOKENS,
    }),
    temperature: parseNumber(values.temperature, "temperature", "float", { min: 0, max: 2 }),
    topK: parseNumber(values["top-k"], "top-k", "int", { min: 0 }),
    topP: parseNumber(values["top-p"], "top-p", "float", { above: 0, max: 1 }),
    minP: parseNumber(values["min-p"], "min-p", "float", { min: 0, max: 1 }),
    repetitionPenalty: parseNumber(values["repetition-penalty"], "repetition-penalty", "float", {
      above: 0,
    }),
    seed: parseNumber(values.seed, "seed", "int", { min: 0, max: 2 ** 32 - 1 }),
    stop: values.stop,
  };
}

/**
 * Reads keyOptions (--key-id/--key-file, both or neither) into a signing/verification key.
 *
 * @param values parsed values holding `key-id` and `key-file`
 * @returns the key id and raw key bytes, or undefined when neither flag is given
 * @throws {UsageError} when only one is given; Deno.errors.NotFound etc. when the file can't be read
 */
export async function readKeyOptions(
  values: { "key-id"?: unknown; "key-file"?: unknown },
): Promise<{ keyId: string; key: Uint8Array } | undefined> {
  const id = values["key-id"], file = values["key-file"];
  if (id === undefined && file === undefined) return undefined;
  if (typeof id !== "string" || typeof file !== "string") {
    throw new UsageError("--key-id and --key-file go together");
  }
  return { keyId: id, key: await Deno.readFile(file) };
}

// ---- output ----

/**
 * Writes all of a string to stdout (UTF-8).
 *
 * @param text the text
 */
export async function writeStdout(text: string): Promise<void> {
  const bytes = new TextEncoder().encode(text);
  let off = 0;
  while (off < bytes.length) off += await Deno.stdout.write(bytes.subarray(off));
}

/**
 * Prints a command's usage text to stdout, for --help: `if (v.help) return await printUsage(usage)`.
 *
 * @param usage the usage text (a newline is added)
 * @returns exit code 0
 */
export async function printUsage(usage: string): Promise<number> {
  await writeStdout(usage + "\n");
  return 0;
}
