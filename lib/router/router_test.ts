// Tests of the tier router against hand-worked decisions: explicit wins, first matching rule,
// default tier, keyword word matching, sticky escalation per user, bad tiers refused.
import assert from "node:assert/strict";
import { DEFAULT_RULES, Router } from "./mod.ts";

const tiers = ["fast", "balanced", "powerful"];

Deno.test("Router.route() follows explicit, then the default heuristic, then the default tier", () => {
  const r = new Router({ tiers, defaultTier: "fast" });
  assert.equal(r.rules.length, DEFAULT_RULES.length);
  assert.deepEqual(
    r.route({ prompt: "hello", promptTokens: 2, explicit: "balanced" }).tier,
    "balanced",
  );
  assert.deepEqual(r.route({ prompt: "Explain tides", promptTokens: 3 }), {
    tier: "powerful",
    reason: "rule",
    rule: 0,
    previousTier: undefined,
  });
  assert.equal(r.route({ prompt: "x", promptTokens: 96 }).tier, "powerful");
  assert.equal(r.route({ prompt: "Write a poem", promptTokens: 3 }).tier, "balanced");
  assert.equal(r.route({ prompt: "x", promptTokens: 32 }).tier, "balanced");
  assert.equal(r.route({ prompt: "x", promptTokens: 31 }).tier, "fast");
  // whole words only: "explained" is not "explain"
  assert.deepEqual(r.route({ prompt: "unexplained", promptTokens: 1 }).reason, "default");
});

Deno.test("Router.route() applies configured rules in order with all their conditions", () => {
  const r = new Router({
    tiers,
    defaultTier: "balanced",
    rules: [{ tier: "powerful", keywords: ["code"], min_tokens: 10 }, {
      tier: "fast",
      max_tokens: 4,
    }],
  });
  assert.equal(r.route({ prompt: "code please", promptTokens: 5 }).tier, "balanced");
  assert.equal(r.route({ prompt: "code please", promptTokens: 12 }).tier, "powerful");
  assert.equal(r.route({ prompt: "hi", promptTokens: 1 }).tier, "fast");
});

Deno.test("Router keeps a user's conversation from moving down a tier (sticky escalation)", () => {
  const r = new Router({ tiers, defaultTier: "fast" });
  r.commit("u", "powerful");
  const d = r.route({ prompt: "hi", promptTokens: 1, userId: "u" });
  assert.deepEqual(d, { tier: "powerful", reason: "sticky", previousTier: "powerful" });
  assert.equal(r.route({ prompt: "hi", promptTokens: 1, userId: "other" }).tier, "fast");
  const loose = new Router({ tiers, defaultTier: "fast", sticky: false });
  loose.commit("u", "powerful");
  assert.equal(loose.route({ prompt: "hi", promptTokens: 1, userId: "u" }).tier, "fast");
});

Deno.test("Router refuses unknown default tiers and rules naming unknown tiers; drops default rules for absent tiers", () => {
  assert.throws(() => new Router({ tiers, defaultTier: "x" }), RangeError);
  assert.throws(
    () => new Router({ tiers, defaultTier: "fast", rules: [{ tier: "x" }] }),
    /rules\[0\]/,
  );
  const two = new Router({ tiers: ["fast", "balanced"], defaultTier: "fast" });
  assert.ok(two.rules.every((x) => x.tier !== "powerful"));
});
