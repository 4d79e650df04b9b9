// Tests for per-tier backend resolution: every tier is probed before any model loads, auto tiers
// fall back to the CPU with the CUDA probe's reason in one note naming them all, and an explicit
// cuda tier on a machine without a usable device is refused naming the tier. Oracle: the
// library's own probe answers (probeBackend).
import assert from "node:assert/strict";
import { parseConfig } from "../config/mod.ts";
import { autoFallbackWords, probeBackend } from "../native/mod.ts";
import { autoFallbackNote, resolveTierBackends, TierBackendError } from "./backends.ts";

const models = new URL("../../models/", import.meta.url).pathname;

function config(backends: Record<string, string>) {
  const tiers = Object.fromEntries(
    Object.entries(backends).map((
      [name, backend],
    ) => [name, { model: `${models}tiny-fast`, backend }]),
  );
  return parseConfig({ tiers }, { env: () => undefined, baseDir: models });
}

Deno.test("`resolveTierBackends()` puts auto and cpu tiers on the CPU and one note names the auto ones", () => {
  const cuda = probeBackend("cuda");
  assert.equal(cuda.ok, false, "this test needs a machine without CUDA");
  const r = resolveTierBackends(config({ a: "auto", b: "cpu", c: "auto" }));
  assert.deepEqual([...r.keys()], ["a", "b", "c"]);
  for (const v of r.values()) assert.equal(v.backend, "cpu");
  assert.equal(r.get("b")!.fallbackReason, undefined);
  assert.equal(
    autoFallbackNote(r),
    `backend auto → cpu for tiers a, c (${autoFallbackWords(cuda.info)})`,
  );
  assert.equal(autoFallbackNote(resolveTierBackends(config({ a: "cpu" }))), null);
});

Deno.test("`resolveTierBackends()` refuses a cuda tier without a usable device, naming the tier", () => {
  assert.throws(() => resolveTierBackends(config({ fast: "cpu", big: "cuda" })), (e: unknown) => {
    assert.ok(e instanceof TierBackendError);
    assert.equal(e.tier, "big");
    assert.equal(
      e.message,
      `tier "big": backend cuda (device 0) is unavailable: ${probeBackend("cuda").info}`,
    );
    return true;
  });
});
