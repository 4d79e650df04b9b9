// Tests of model_pair.ts on the committed demo models and projector: which projector a pair gets,
// the "--projector is required" usage error, and that disposing the pair frees both models.
// Oracles: the model directory names, the committed projector's directory, the documented message.

import assert from "node:assert/strict";
import { UsageError } from "./command.ts";
import { loadMigrationPair, loadModelPair } from "./model_pair.ts";

const models = new URL("../../models/", import.meta.url).pathname;
const fast = `${models}tiny-fast`, balanced = `${models}tiny-balanced`;
const projectorDir = `${models}projectors/tiny-fast--tiny-balanced`;

Deno.test("`loadMigrationPair()` loads the given projector and disposing the pair frees both models", async () => {
  const pair = await loadMigrationPair(
    { sourceDir: fast, targetDir: balanced, projectorDir },
    { threads: 1 },
  );
  try {
    assert.equal(pair.source.name, "tiny-fast");
    assert.equal(pair.target.name, "tiny-balanced");
    assert.ok(pair.projector !== null);
    assert.equal(pair.projector.dir, projectorDir);
    pair.source.native.createSequence(4).free();
  } finally {
    await pair[Symbol.asyncDispose]();
  }
  for (const m of [pair.source, pair.target]) {
    assert.throws(() => m.native.createSequence(4), /has been freed/);
  }
});

Deno.test("`loadMigrationPair()` throws a UsageError when --projector is absent and the models differ", async () => {
  await assert.rejects(
    loadMigrationPair({ sourceDir: fast, targetDir: balanced }, { threads: 1 }),
    (e: unknown) => {
      assert.ok(e instanceof UsageError);
      assert.equal(e.message, "--projector is required for different models");
      return true;
    },
  );
});

Deno.test("`loadMigrationPair()` gives no projector when source and target are the same model", async () => {
  await using pair = await loadMigrationPair(
    { sourceDir: fast, targetDir: fast },
    { threads: 1, kvDtype: "bf16" },
  );
  assert.equal(pair.projector, null);
  assert.equal(pair.source.fingerprint, pair.target.fingerprint);
  assert.equal(pair.target.native.kvDtype, "bf16");
});

Deno.test("`loadModelPair()` loads different models without a projector and rejects a missing target", async () => {
  await using pair = await loadModelPair(
    { sourceDir: fast, targetDir: balanced, projectorDir },
    { threads: 1 },
  );
  assert.equal(pair.projector, null);
  assert.notEqual(pair.source.fingerprint, pair.target.fingerprint);
  await assert.rejects(
    loadModelPair({ sourceDir: fast, targetDir: `${models}no-such-model` }, { threads: 1 }),
    /no-such-model/,
  );
});
