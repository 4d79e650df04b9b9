// End-to-end tests of `snapshot` and `continue` as real processes: greedy continue prints exactly
// what `generate` prints, and corrupt, truncated, future-version or foreign snapshots exit 1 with
// one stderr line naming the failed check.

import assert from "node:assert/strict";

const ROOT = new URL("../../", import.meta.url).pathname;
const MAIN = `${ROOT}lib/cli/main.ts`;
const FAST = `${ROOT}models/tiny-fast`;
const PROMPT = "It was the best of times, it was the worst of times, it was the age of";

async function cli(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MAIN, ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

Deno.test("`continue` prints what `generate` prints and rejects damaged snapshots in one line", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = `${dir}/p.kvs`;
    const s = await cli(
      "snapshot",
      "--model",
      FAST,
      "--prompt",
      PROMPT,
      "--out",
      file,
      "--threads",
      "1",
    );
    assert.equal(s.code, 0, s.stderr);
    assert.equal(s.stdout, "");
    const [g, c] = await Promise.all([
      cli("generate", "--model", FAST, "--prompt", PROMPT, "--max-tokens", "30", "--threads", "1"),
      cli("continue", "--model", FAST, "--snapshot", file, "--max-tokens", "30", "--threads", "1"),
    ]);
    assert.equal(g.code, 0, g.stderr);
    assert.equal(c.code, 0, c.stderr);
    assert(c.stdout.length > 0);
    assert.equal(c.stdout, g.stdout);

    const bytes = await Deno.readFile(file);
    const cases: [string, Uint8Array, string][] = [];
    const flipped = bytes.slice();
    flipped[bytes.length - 50] ^= 4;
    cases.push(["checksum", flipped, FAST]);
    cases.push(["bounds", bytes.slice(0, bytes.length - 300), FAST]);
    const v9 = bytes.slice();
    v9[8] = 9;
    cases.push(["version", v9, FAST]);
    cases.push(["fingerprint", bytes, `${ROOT}models/tiny-powerful`]);
    const results = await Promise.all(cases.map(async ([kind, b, model], i) => {
      const f = `${dir}/bad${i}.kvs`;
      await Deno.writeFile(f, b);
      return [
        kind,
        await cli("continue", "--model", model, "--snapshot", f, "--threads", "1"),
      ] as const;
    }));
    for (const [kind, r] of results) {
      assert.equal(r.code, 1, `${kind}: exit ${r.code}`);
      assert.equal(r.stdout, "");
      const lines = r.stderr.trim().split("\n");
      assert.equal(lines.length, 1, `${kind}: ${r.stderr}`);
      assert.match(lines[0], new RegExp(`^error: snapshot .* rejected \\(${kind}\\): `));
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
