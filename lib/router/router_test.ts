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

const A = (user: string) => ({ tenant: "a", user });
const B = (user: string) => ({ tenant: "b", user });

Deno.test("Router keeps a user's conversation from moving down a tier (sticky escalation)", () => {
  const r = new Router({ tiers, defaultTier: "fast" });
  r.commit(A("u"), "powerful");
  const d = r.route({ prompt: "hi", promptTokens: 1, conversation: A("u") });
  assert.deepEqual(d, { tier: "powerful", reason: "sticky", previousTier: "powerful" });
  assert.equal(r.route({ prompt: "hi", promptTokens: 1, conversation: A("other") }).tier, "fast");
  const loose = new Router({ tiers, defaultTier: "fast", sticky: false });
  loose.commit(A("u"), "powerful");
  assert.equal(loose.route({ prompt: "hi", promptTokens: 1, conversation: A("u") }).tier, "fast");
});

Deno.test("Router scopes sticky tiers by tenant: the same user id of another tenant sees nothing and pins nothing", () => {
  const r = new Router({ tiers, defaultTier: "fast" });
  r.commit(A("u"), "powerful");
  assert.deepEqual(r.route({ prompt: "hi", promptTokens: 1, conversation: B("u") }), {
    tier: "fast",
    reason: "default",
    previousTier: undefined,
  });
  r.commit(B("v"), "powerful");
  assert.equal(r.route({ prompt: "hi", promptTokens: 1, conversation: A("v") }).tier, "fast");
  assert.equal(r.route({ prompt: "hi", promptTokens: 1, conversation: B("v") }).tier, "powerful");
});

Deno.test("Router evicts within the committing tenant's share: a flood of one tenant's users keeps another's", () => {
  const r = new Router({ tiers, defaultTier: "fast", maxConversations: 8 });
  for (let i = 0; i < 3; i++) r.commit(A(`a${i}`), "powerful");
  for (let i = 0; i < 1000; i++) r.commit(B(`b${i}`), "balanced");
  // A holds 3 of 8, under an equal share (4): B's flood evicts only B's own entries.
  for (let i = 0; i < 3; i++) {
    assert.equal(
      r.route({ prompt: "hi", promptTokens: 1, conversation: A(`a${i}`) }).tier,
      "powerful",
    );
  }
  // B kept its 5 most recent users; its older ones were forgotten.
  for (let i = 995; i < 1000; i++) {
    assert.equal(
      r.route({ prompt: "hi", promptTokens: 1, conversation: B(`b${i}`) }).reason,
      "sticky",
    );
  }
  assert.equal(
    r.route({ prompt: "hi", promptTokens: 1, conversation: B("b994") }).reason,
    "default",
  );
  // A tenant over its share gives back only what is above it: A at 7 of 8 and B flooding → 4 : 4.
  const s = new Router({ tiers, defaultTier: "fast", maxConversations: 8 });
  for (let i = 0; i < 7; i++) s.commit(A(`a${i}`), "powerful");
  for (let i = 0; i < 100; i++) s.commit(B(`b${i}`), "powerful");
  const kept = [0, 1, 2, 3, 4, 5, 6].filter((i) =>
    s.route({ prompt: "hi", promptTokens: 1, conversation: A(`a${i}`) }).reason === "sticky"
  );
  assert.deepEqual(kept, [3, 4, 5, 6]);
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
