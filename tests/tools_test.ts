// The task-runner tools as a user meets them: `bench` and `deploy render` answer --help, list
// what they can run, and refuse bad input with one line on stderr, a non-zero exit status and no
// stack trace; `deploy render --check` ends with a summary line. Real child processes.

import assert from "node:assert/strict";

const root = new URL("../", import.meta.url).pathname;

async function tool(script: string, ...args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--config", `${root}deno.dev.json`, `${root}${script}`, ...args],
    cwd: root,
    // A server started by mistake (an argument it ignores) stops at once on this config.
    env: { KVRELAY_CONFIG: "/nonexistent/kvrelay.json" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

function assertOneLineError(r: { code: number; stderr: string }, pattern: RegExp) {
  assert.notEqual(r.code, 0, r.stderr);
  assert.doesNotMatch(r.stderr, /Uncaught|^\s+at /m, r.stderr);
  assert.match(r.stderr.split("\n")[0], pattern);
}

Deno.test("`bench --help` prints the usage, `bench list` the sections, and bad input one line", async () => {
  const help = await tool("bench/main.ts", "--help");
  assert.equal(help.code, 0, help.stderr);
  assert.match(help.stdout, /^usage: deno task bench/);
  const list = await tool("bench/main.ts", "list");
  assert.equal(list.code, 0, list.stderr);
  const listed = list.stdout.trim().split("\n").map((l) => l.split(/\s+/)[0]);
  const unknown = await tool("bench/main.ts", "nope");
  assertOneLineError(unknown, /^bench: unknown section "nope"; sections: /);
  // The list names exactly the sections the runner accepts.
  const accepted = /sections: ([a-z, ]+) \(/.exec(unknown.stderr)![1].split(", ");
  assert.deepEqual(listed, accepted);
  assertOneLineError(await tool("bench/main.ts", "--bogus"), /^bench: Unknown option '--bogus'/);
});

Deno.test("`deploy render --tier nope` refuses in one line; `--check` ends with a summary line", async () => {
  const nope = await tool("deploy/render/main.ts", "render", "--tier", "nope");
  assertOneLineError(nope, /^deploy render: .*--tier: no deploy config for "nope" \(have: /);
  assert.equal(nope.code, 2);
  const check = await tool("deploy/render/main.ts", "render", "--check");
  assert.equal(check.code, 0, check.stdout + check.stderr);
  assert.match(
    check.stdout.trim().split("\n").at(-1)!,
    /^deploy render --check: \d+ files up to date$/,
  );
  assert.equal(check.stderr, "", "nothing on stderr (no deprecation warnings)");
});

Deno.test("`start` and `build:native` answer --help and refuse an unknown argument in one line", async () => {
  const help = await tool("functions/main.ts", "--help");
  assert.equal(help.code, 0, help.stderr);
  assert.match(help.stdout, /^usage: deno task start .*\n\s+KVRELAY_CONFIG /);
  assertOneLineError(
    await tool("functions/main.ts", "--port=1"),
    /^kvrelay all: unexpected argument "--port=1"$/,
  );
  const build = await tool("scripts/build_native.ts", "--help");
  assert.equal(build.code, 0, build.stderr);
  assert.match(build.stdout, /^usage: deno task build:native .*--cuda/);
  const bad = await tool("scripts/build_native.ts", "--cdua");
  assertOneLineError(bad, /^build:native: unknown option "--cdua"$/);
  assert.equal(bad.code, 2);
});
