// What a CLI command is, the usage error, and option parsing shared by commands (numbers, model
// options). Commands live one per file and are listed in commands.ts; main.ts dispatches.

import { parseArgs, type ParseArgsConfig } from "node:util";
import type { KvDtype, NativeModelOptions } from "../native/mod.ts";

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

/** Options every model-loading command accepts. */
export const MODEL_OPTIONS = {
  model: { type: "string" },
  threads: { type: "string" },
  "kv-dtype": { type: "string" },
} as const satisfies ParseArgsConfig["options"];

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
  try {
    return parseArgs({
      args,
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
 * @throws {UsageError} when absent
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
 * @returns the number, or undefined when the option was not given
 * @throws {UsageError} when the text is not such a number
 */
export function parseNumber(
  value: unknown,
  flag: string,
  kind: "int" | "float",
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
  return n;
}

/**
 * Native options from --threads and --kv-dtype.
 *
 * @param values parsed values holding `threads` and `kv-dtype`
 * @returns NativeModelOptions (threads 0 = all cores; kvDtype default f32)
 * @throws {UsageError} for a bad thread count or an unknown dtype
 */
export function nativeOptions(
  values: { threads?: unknown; "kv-dtype"?: unknown },
): NativeModelOptions {
  const threads = parseNumber(values.threads, "threads", "int");
  if (threads !== undefined && threads < 0) {
    throw new UsageError(`--threads must be >= 0, got ${threads}`);
  }
  const kv = values["kv-dtype"];
  if (kv !== undefined && kv !== "f32" && kv !== "f16" && kv !== "bf16") {
    throw new UsageError(`--kv-dtype must be f32, f16 or bf16, got ${JSON.stringify(kv)}`);
  }
  return { threads, kvDtype: kv as KvDtype | undefined };
}

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
