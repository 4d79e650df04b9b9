// Tests of withCacheTemperature against hand-computed temperatures.
import assert from "node:assert/strict";
import { withCacheTemperature } from "./generation.ts";

Deno.test("withCacheTemperature() multiplies the sampling temperature by a migrated cache's T, keeps greedy", () => {
  const migrated = { source: "migrated" as const, reusedTokens: 8, logitTemperature: 1.25 };
  assert.equal(withCacheTemperature({ temperature: 0.8 }, migrated).temperature, 1);
  assert.equal(withCacheTemperature({ temperature: 0 }, migrated).temperature, 0);
  assert.equal(withCacheTemperature({ temperature: 1.6 }, migrated).temperature, 2);
  assert.equal(
    withCacheTemperature({ temperature: 0.5 }, { source: "prefix", reusedTokens: 8 }).temperature,
    0.5,
  );
});
