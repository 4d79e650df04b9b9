// Tests for NativeModel: loading every demo checkpoint, option validation, native load failures
// surfacing as EngineError with a status name, and free()/dispose semantics. Needs the built
// library (`deno task build:native`, or KVRELAY_LIB).

import assert from "node:assert/strict";
import { NativeModel } from "./model.ts";
import { EngineError } from "./errors.ts";
import type { KvDtype } from "./dtype.ts";
import { checkpoint, DEMO_DIRS } from "./test_helpers.ts";

Deno.test("`NativeModel.load()` loads each demo model with each KV dtype", async () => {
  for (const dir of DEMO_DIRS) {
    const ckpt = await checkpoint(dir);
    for (const kvDtype of ["f32", "bf16", "f16"] as KvDtype[]) {
      using m = NativeModel.load(ckpt, { kvDtype, threads: 1 });
      assert.equal(m.kvDtype, kvDtype);
      assert.equal(m.threads, 1);
      assert.equal(m.config, ckpt.config);
    }
  }
});

Deno.test("`NativeModel.load()` resolves threads 0 to at least one worker", async () => {
  using m = NativeModel.load(await checkpoint(DEMO_DIRS[0]));
  assert.ok(m.threads >= 1, `threads ${m.threads}`);
  assert.equal(m.kvDtype, "f32");
});

Deno.test("`NativeModel.load()` refuses bad options before FFI", async () => {
  const ckpt = await checkpoint(DEMO_DIRS[0]);
  assert.throws(
    () => NativeModel.load(ckpt, { kvDtype: "q8" as KvDtype }),
    /kvDtype must be .* got "q8"/,
  );
  assert.throws(() => NativeModel.load(ckpt, { threads: -1 }), RangeError);
  assert.throws(() => NativeModel.load(ckpt, { threads: 1.5 }), TypeError);
});

Deno.test("`NativeModel.load()` throws EngineError when a tensor lies past the end of its file", async () => {
  const ckpt = await checkpoint(DEMO_DIRS[0]);
  const tensors = new Map(ckpt.tensors);
  const norm = tensors.get("model.norm.weight")!;
  const size = (await Deno.stat(norm.file)).size;
  tensors.set(norm.name, { ...norm, offset: size - 2 });
  assert.throws(() => NativeModel.load({ ...ckpt, tensors }), (e: unknown) => {
    assert.ok(e instanceof EngineError, `expected EngineError, got ${e}`);
    assert.ok(e.code < 0);
    assert.ok(
      ["CORRUPT", "OUT_OF_RANGE", "INVALID_ARGUMENT", "IO"].includes(e.codeName),
      e.codeName,
    );
    assert.match(e.message, /^kvr_model_load failed \(/);
    return true;
  });
});

Deno.test("`NativeModel.load()` throws EngineError IO for a missing weights file", async () => {
  const ckpt = await checkpoint(DEMO_DIRS[0]);
  const missing = "/nonexistent/model.safetensors";
  const tensors = new Map([...ckpt.tensors].map(([k, t]) => [k, { ...t, file: missing }]));
  assert.throws(
    () => NativeModel.load({ ...ckpt, tensors, files: [missing] }),
    (e: unknown) => e instanceof EngineError && e.codeName === "IO",
  );
});

Deno.test("`NativeModel.free()` is idempotent and frees its sequences", async () => {
  const m = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const s = m.createSequence(8);
  m.free();
  m.free();
  assert.throws(() => s.length, /has been freed/);
  assert.throws(() => m.createSequence(4), /model has been freed/);
  s.free();
});

Deno.test("`NativeModel.createSequence()` refuses a capacity outside [1, 2^32-1]", async () => {
  using m = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  assert.throws(() => m.createSequence(0), RangeError);
  assert.throws(() => m.createSequence(-5), RangeError);
  assert.throws(() => m.createSequence(2 ** 32), RangeError);
  assert.throws(() => m.createSequence(2.5), TypeError);
  assert.throws(() => m.createSequence("8" as unknown as number), TypeError);
  using s = m.createSequence(16);
  assert.equal(s.capacity, 16);
  assert.equal(s.length, 0);
});

Deno.test("`NativeModel.createSequence()` surfaces a native allocation failure as EngineError OUT_OF_MEMORY", async () => {
  using m = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  assert.throws(() => m.createSequence(2 ** 32 - 1), (e: unknown) => {
    assert.ok(e instanceof EngineError, `expected EngineError, got ${e}`);
    assert.equal(e.codeName, "OUT_OF_MEMORY");
    assert.match(e.message, /capacity 4294967295|4294967295 tokens/);
    return true;
  });
});

Deno.test("`NativeModel.free()` during an in-flight prefill waits for it, then frees", async () => {
  const m = NativeModel.load(await checkpoint(DEMO_DIRS[0]));
  const s = m.createSequence(64);
  const p = s.prefill(Array.from({ length: 48 }, (_, i) => (i * 37) % m.config.vocabSize));
  m.free();
  assert.throws(() => m.createSequence(4), /model has been freed/);
  const logits = await p;
  assert.equal(logits.length, m.config.vocabSize);
  assert.ok(logits.every(Number.isFinite));
  assert.throws(() => s.length, /has been freed/);
});
