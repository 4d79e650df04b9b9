// Unit tests of the shared CLI option groups and parsers in command.ts, run in-process on argv
// arrays (no models, no subprocesses). Oracles: the literal values and error messages the CLI
// documents, written out here by hand.

import assert from "node:assert/strict";
import {
  keyOptions,
  migrationOptions,
  modelOptions,
  parseModelLoadOptions,
  parseOptions,
  parsePairOptions,
  parseRepairList,
  parseSamplingOptions,
  pick,
  readKeyOptions,
  samplingOptions,
  UsageError,
} from "./command.ts";

/** Asserts that `f` throws a UsageError whose message is exactly `message`. */
function throwsUsage(f: () => unknown, message: string): void {
  assert.throws(f, (e: unknown) => {
    assert.ok(e instanceof UsageError, `not a UsageError: ${e}`);
    assert.equal(e.message, message);
    return true;
  });
}

Deno.test("`parseSamplingOptions()` returns the given numbers and stop strings, undefined for the rest", () => {
  const argv = ["--max-tokens", "12", "--temperature", "0.7", "--top-k", "40", "--stop", "a"];
  const v = parseOptions([...argv, "--stop", "\n\n", "--seed=3"], samplingOptions);
  assert.deepEqual(parseSamplingOptions(v), {
    maxTokens: 12,
    temperature: 0.7,
    topK: 40,
    topP: undefined,
    minP: undefined,
    repetitionPenalty: undefined,
    seed: 3,
    stop: ["a", "\n\n"],
  });
  assert.deepEqual(
    parseSamplingOptions(parseOptions(["--top-p", " 0.9 ", "--min-p", "1e-2"], samplingOptions)),
    {
      maxTokens: undefined,
      temperature: undefined,
      topK: undefined,
      topP: 0.9,
      minP: 0.01,
      repetitionPenalty: undefined,
      seed: undefined,
      stop: undefined,
    },
  );
});

Deno.test("`parseSamplingOptions()` throws a UsageError naming the flag and quoting the value when a number is malformed or out of range", () => {
  const cases: [string, string, string][] = [
    ["--max-tokens", "abc", '--max-tokens must be an integer, got "abc"'],
    ["--max-tokens", "1.5", '--max-tokens must be an integer, got "1.5"'],
    ["--temperature", "hot", '--temperature must be a number, got "hot"'],
    ["--temperature", "Infinity", '--temperature must be a number, got "Infinity"'],
    ["--top-k", "2.5", '--top-k must be an integer, got "2.5"'],
    ["--top-p", "", '--top-p must be a number, got ""'],
    ["--min-p", "0.1x", '--min-p must be a number, got "0.1x"'],
    ["--seed", "9007199254740993", '--seed must be an integer, got "9007199254740993"'],
    ["--max-tokens", "0", '--max-tokens must be in [1, 32768], got "0"'],
    ["--max-tokens", "1e12", '--max-tokens must be in [1, 32768], got "1e12"'],
    ["--temperature", "1e308", '--temperature must be in [0, 2], got "1e308"'],
    ["--top-k", "-1", '--top-k must be in [0, inf], got "-1"'],
    ["--top-p", "0", '--top-p must be in (0, 1], got "0"'],
    ["--min-p", "1.5", '--min-p must be in [0, 1], got "1.5"'],
    ["--seed", "-1", '--seed must be in [0, 4294967295], got "-1"'],
    ["--seed", "4294967296", '--seed must be in [0, 4294967295], got "4294967296"'],
  ];
  for (const [flag, value, message] of cases) {
    throwsUsage(
      () => parseSamplingOptions(parseOptions([`${flag}=${value}`], samplingOptions)),
      message,
    );
  }
});

Deno.test("`parseModelLoadOptions()` reads --threads and --kv-dtype and rejects bad values with the flag and value", () => {
  const load = (...argv: string[]) => parseModelLoadOptions(parseOptions(argv, modelOptions));
  const none = { backend: "auto", device: undefined, logAutoFallback: false, weights: undefined };
  assert.deepEqual(load(), { threads: undefined, kvDtype: undefined, ...none });
  assert.deepEqual(load("--threads", "0", "--kv-dtype", "bf16"), {
    threads: 0,
    kvDtype: "bf16",
    ...none,
  });
  assert.deepEqual(load("--threads", "3", "--kv-dtype", "f16"), {
    threads: 3,
    kvDtype: "f16",
    ...none,
  });
  throwsUsage(() => load("--threads", "two"), '--threads must be an integer, got "two"');
  throwsUsage(() => load("--threads=-1"), "--threads must be >= 0, got -1");
  throwsUsage(() => load("--kv-dtype", "fp8"), '--kv-dtype must be f32, f16 or bf16, got "fp8"');
  throwsUsage(() => load("--kv-dtype", "F32"), '--kv-dtype must be f32, f16 or bf16, got "F32"');
});

Deno.test("`parseModelLoadOptions()` reads --weights and rejects an unknown format with the flag and value", () => {
  const load = (...argv: string[]) => parseModelLoadOptions(parseOptions(argv, modelOptions));
  assert.equal(load("--weights", "q8").weights, "q8");
  assert.equal(load("--weights=bf16").weights, "bf16");
  assert.equal(load("--weights", "q4").weights, "q4");
  throwsUsage(() => load("--weights", "q4_k"), '--weights must be bf16, q8 or q4, got "q4_k"');
});

Deno.test("`parseModelLoadOptions()` reads --backend and --device and rejects bad values with the flag and value", () => {
  const load = (...argv: string[]) => parseModelLoadOptions(parseOptions(argv, modelOptions));
  for (const b of ["auto", "cpu", "cuda"]) {
    assert.equal(load("--backend", b).backend, b);
    assert.equal(load("--backend", b).logAutoFallback, true);
  }
  assert.equal(load("--device", "3").device, 3);
  assert.equal(load("--backend=cuda", "--device=1").device, 1);
  throwsUsage(() => load("--backend", "gpu"), '--backend must be auto, cpu or cuda, got "gpu"');
  throwsUsage(() => load("--backend", "CUDA"), '--backend must be auto, cpu or cuda, got "CUDA"');
  throwsUsage(() => load("--device", "x"), '--device must be an integer, got "x"');
  throwsUsage(() => load("--device=-1"), '--device must be in [0, 2147483647], got "-1"');
});

Deno.test("`parsePairOptions()` requires --source and --target and passes --projector through", () => {
  const pair = (...argv: string[]) => parsePairOptions(parseOptions(argv, migrationOptions));
  assert.deepEqual(pair("--source", "a", "--target", "b"), {
    sourceDir: "a",
    targetDir: "b",
    projectorDir: undefined,
  });
  assert.deepEqual(pair("--target", "b", "--source", "a", "--projector", "p", "--threads", "1"), {
    sourceDir: "a",
    targetDir: "b",
    projectorDir: "p",
  });
  throwsUsage(() => pair("--target", "b"), "--source is required");
  throwsUsage(() => pair("--source", "a", "--target", ""), "--target is required");
});

Deno.test("`parseOptions()` with pick() accepts only the picked flags of a group", () => {
  const table = { ...modelOptions, ...pick(samplingOptions, ["max-tokens", "seed"]) };
  assert.deepEqual(Object.keys(pick(samplingOptions, ["max-tokens", "seed"])), [
    "max-tokens",
    "seed",
  ]);
  const v = parseOptions(["--model", "m", "--max-tokens", "4", "--seed", "1"], table);
  assert.equal(parseSamplingOptions(v).maxTokens, 4);
  for (const flag of ["--top-p", "--min-p", "--stop", "--temperature"]) {
    assert.throws(() => parseOptions([flag, "1"], table), UsageError, flag);
  }
  assert.throws(() => parseOptions(["stray"], table), UsageError);
  assert.throws(() => parseOptions(["--model"], table), UsageError);
  assert.equal(parseOptions(["--help"], table).help, true);
});

Deno.test("`parseRepairList()` reads positive integers and names the flag and the bad item otherwise", () => {
  assert.deepEqual(parseRepairList("1, 8,32", "repair"), [1, 8, 32]);
  throwsUsage(() => parseRepairList("1,0", "repair"), '--repair: "0" is not an integer >= 1');
  throwsUsage(
    () => parseRepairList("4,,8", "eval-repair"),
    '--eval-repair: "" is not an integer >= 1',
  );
  throwsUsage(() => parseRepairList("2.5", "repair"), '--repair: "2.5" is not an integer >= 1');
});

Deno.test("`readKeyOptions()` reads the key file when both flags are given and refuses one alone", async () => {
  const file = await Deno.makeTempFile();
  try {
    const key = new Uint8Array([1, 2, 3, 250, 0, 17]);
    await Deno.writeFile(file, key);
    const read = (...argv: string[]) => readKeyOptions(parseOptions(argv, keyOptions));
    assert.equal(await read(), undefined);
    assert.deepEqual(await read("--key-id", "k1", "--key-file", file), { keyId: "k1", key });
    for (const argv of [["--key-id", "k1"], ["--key-file", file]]) {
      await assert.rejects(read(...argv), (e: unknown) => {
        assert.ok(e instanceof UsageError);
        assert.equal(e.message, "--key-id and --key-file go together");
        return true;
      });
    }
  } finally {
    await Deno.remove(file);
  }
});

Deno.test("`parseOptions()` takes `--flag -1` as the value -1, so the value's own check answers", () => {
  throwsUsage(
    () => parseSamplingOptions(parseOptions(["--temperature", "-1"], samplingOptions)),
    '--temperature must be in [0, 2], got "-1"',
  );
  throwsUsage(
    () => parseSamplingOptions(parseOptions(["--seed", "-.5"], samplingOptions)),
    '--seed must be an integer, got "-.5"',
  );
  // An option after a string option is still an option (a missing value).
  assert.throws(() => parseOptions(["--stop", "--seed"], samplingOptions), UsageError);
});
