// Tests of the start-up check for optional parts: an `onnx` projector in the config needs the
// onnxruntime-node part; without it the problem names the config field and what leaves it out.
import assert from "node:assert/strict";
import { parseConfig } from "../config/mod.ts";
import { OnnxRuntimeMissingError } from "../migrate/mod.ts";
import { projectorPartProblems } from "./migrator.ts";

const models = new URL("../../models/", import.meta.url).pathname;
const config = parseConfig({
  tiers: { fast: { model: "tiny-fast" }, powerful: { model: "tiny-powerful" } },
  projectors: [
    { from: "fast", to: "powerful", path: "projectors/tiny-fast--tiny-powerful" }, // linear
    { from: "powerful", to: "fast", path: "projectors/nowhere" }, // unreadable: left to load()
    { from: "fast", to: "powerful", path: "projectors/tiny-fast--tiny-powerful-mlp" }, // onnx
  ],
}, { env: () => undefined, baseDir: models });

Deno.test("projectorPartProblems() names projectors.<i>.path when the ONNX part is missing", async () => {
  let calls = 0;
  const problems = await projectorPartProblems(config, () => {
    calls++; // only for the onnx projector
    return Promise.reject(new OnnxRuntimeMissingError("module not found"));
  });
  assert.equal(calls, 1);
  assert.equal(problems.length, 1);
  assert.match(
    problems[0],
    new RegExp(
      `^projectors\\.2\\.path: ${models}projectors/tiny-fast--tiny-powerful-mlp is an onnx`,
    ),
  );
  assert.match(problems[0], /optional onnxruntime-node part.*KVRELAY_ONNX=1/);
});

Deno.test("projectorPartProblems() is empty when the ONNX part loads, and rethrows other errors", async () => {
  assert.deepEqual(await projectorPartProblems(config, () => Promise.resolve({})), []);
  await assert.rejects(
    projectorPartProblems(config, () => Promise.reject(new RangeError("bug"))),
    RangeError,
  );
});
