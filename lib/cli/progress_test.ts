// Tests of the progress bar's two forms: redrawn in place on a terminal, one line per phase
// otherwise (a CI log keeps no carriage-return redraws). Runs progressBar in a child process so
// its stderr is a pipe, the oracle being the bytes it wrote.

import assert from "node:assert/strict";

const progress = new URL("./progress.ts", import.meta.url).href;

async function stderrOf(terminal: string): Promise<string> {
  const code = `
    import { progressBar } from "${progress}";
    const bar = progressBar("fit a→b"${terminal});
    for (let i = 0; i <= 50; i++) bar("accumulate", i, 50);
    for (let i = 0; i <= 3; i++) bar("solve", i, 3);`;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--no-config", code],
    stdout: "null",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0);
  return new TextDecoder().decode(out.stderr);
}

Deno.test("`progressBar()` writes one line per phase and no redraws when stderr is not a terminal", async () => {
  const text = await stderrOf("");
  assert.equal(text.includes("\r"), false);
  assert.deepEqual(text.trim().split("\n").map((l) => l.replace(/ in \d+s$/, "")), [
    "fit a→b accumulate 50/50",
    "fit a→b solve 3/3",
  ]);
});

Deno.test("`progressBar()` redraws in place on a terminal", async () => {
  const text = await stderrOf(", true");
  assert.equal(text.split("\r").length - 1, 51 + 4);
  assert.match(text, /fit a→b solve \[#{30}\] 3\/3 100%/);
});
