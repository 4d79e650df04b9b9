// The API key as a client sends it: KVRELAY_API_KEYS lists `tenant:key` (docs/http.md), the
// Authorization header carries the key alone; the header form `Bearer tenant:key` is refused
// with a message that says so, and a configured key no Bearer header could carry stops the config.

import assert from "node:assert/strict";
import { ConfigError, parseConfig } from "../../lib/config/mod.ts";
import { createGenerateApp } from "../generate/app.ts";
import { testRuntime } from "./test_helpers.ts";

Deno.test("`Bearer <key>` authenticates a `tenant:key` entry; `Bearer tenant:key` is a 400 naming the form", async () => {
  const rt = await testRuntime({ env: { KVRELAY_API_KEYS: "alice:sk-1" } });
  try {
    const app = createGenerateApp(rt);
    const get = (authorization: string) =>
      app.request("/v1/models", { headers: { authorization } });
    const ok = await get("Bearer sk-1");
    assert.equal(ok.status, 200);
    await ok.body?.cancel();
    const bad = await get("Bearer alice:sk-1");
    assert.equal(bad.status, 400);
    const err = (await bad.json()).error;
    assert.equal(err.type, "authentication_error");
    assert.match(err.message, /Bearer <key> with the key alone .*tenant:/);
    const wrong = await get("Bearer alice");
    assert.equal(wrong.status, 401);
    await wrong.body?.cancel();
  } finally {
    await rt.close();
  }
});

Deno.test("parseConfig() refuses an API key a Bearer header cannot carry, without quoting it", () => {
  const env = (n: string) => ({ KVRELAY_API_KEYS: "alice:sk-1,bob:sk 2" })[n];
  assert.throws(
    () => parseConfig({ tiers: { t: { model: "/m" } } }, { env }),
    (e: unknown) => {
      assert.ok(e instanceof ConfigError);
      assert.deepEqual(e.problems, [
        "env KVRELAY_API_KEYS: entry 2's key has characters a Bearer token cannot carry (allowed: letters, digits, . _ ~ + / - and trailing =)",
      ]);
      assert.doesNotMatch(e.message, /sk 2/);
      return true;
    },
  );
});
