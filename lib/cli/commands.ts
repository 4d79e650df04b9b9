// The CLI's command table: name → command. Adding a command is one import and one line here;
// the command itself lives in its own file next to this one.

import type { CliCommand } from "./command.ts";
import { compareCommand } from "./compare.ts";
import { evalMigrationCommand } from "./eval_migration.ts";
import { fitCommand } from "./fit.ts";
import { generateCommand } from "./generate.ts";
import { scoreCommand } from "./score.ts";
import { snapshotCommand } from "./snapshot.ts";
import { continueCommand } from "./continue.ts";

/** Every `deno task cli <name>` command, by name. */
export const commands: Record<string, CliCommand> = {
  compare: compareCommand,
  "eval-migration": evalMigrationCommand,
  fit: fitCommand,
  generate: generateCommand,
  score: scoreCommand,
  snapshot: snapshotCommand,
  continue: continueCommand,
};
