// kvrelay CLI entry: `deno task cli <command> [options]` (= deno run -A lib/cli/main.ts ...).
// Dispatches to the command table in commands.ts; results go to stdout, errors to stderr as one
// line with a non-zero exit (2 for usage errors, 1 otherwise). No command logic lives here.

import { commands } from "./commands.ts";
import { UsageError } from "./command.ts";

function listing(): string {
  const width = Math.max(...Object.keys(commands).map((n) => n.length));
  const lines = Object.entries(commands).map(([name, c]) =>
    `  ${name.padEnd(width)}  ${c.summary}`
  );
  return `usage: deno task cli <command> [options]   (<command> --help for its options)\n\ncommands:\n${
    lines.join("\n")
  }\n`;
}

function oneLine(e: unknown): string {
  const err = e instanceof Error ? e : new Error(String(e));
  const name = err instanceof UsageError || err.name === "Error" ? "" : `${err.name}: `;
  return `error: ${name}${err.message}`.replace(/\s*\n\s*/g, " ");
}

/**
 * Runs one CLI invocation.
 *
 * @param args process arguments: the command name, then its options
 * @returns the exit code
 */
export async function main(args: string[]): Promise<number> {
  const [name, ...rest] = args;
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    const text = listing();
    if (name === undefined) {
      await Deno.stderr.write(new TextEncoder().encode(text));
      return 2;
    }
    await Deno.stdout.write(new TextEncoder().encode(text));
    return 0;
  }
  const command = Object.hasOwn(commands, name) ? commands[name] : undefined;
  if (command === undefined) {
    console.error(
      `error: unknown command ${JSON.stringify(name)}; commands: ${
        Object.keys(commands).join(", ")
      }`,
    );
    return 2;
  }
  try {
    return await command.run(rest);
  } catch (e) {
    if (e instanceof UsageError) {
      console.error(`${oneLine(e)} (see: deno task cli ${name} --help)`);
      return 2;
    }
    console.error(oneLine(e));
    return 1;
  }
}

if (import.meta.main) Deno.exit(await main(Deno.args));
