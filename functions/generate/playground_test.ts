// Route tests of the playground's static files via app.request(): served at GET / without an API
// key even when keys are on (the page asks for one; the API calls it makes need it), with a CSP
// that allows only this origin, and a script that never turns text into markup.
import assert from "node:assert/strict";
import { testRuntime } from "../shared/test_helpers.ts";
import { createGenerateApp } from "./app.ts";

Deno.test("GET / serves the playground page, script and stylesheet without a key; the API still needs one", async () => {
  const rt = await testRuntime({ env: { KVRELAY_API_KEYS: "k" }, load: false });
  try {
    const app = createGenerateApp(rt);
    const page = await app.request("/");
    assert.equal(page.status, 200);
    assert.match(page.headers.get("content-type")!, /^text\/html/);
    assert.match(page.headers.get("content-security-policy")!, /default-src 'none'/);
    const html = await page.text();
    const files: [string, RegExp][] = [
      ["/playground/app.js", /javascript/],
      ["/playground/style.css", /css/],
    ];
    for (const [path, type] of files) {
      assert.ok(html.includes(`"${path}"`), `the page loads ${path}`);
      const res = await app.request(path);
      assert.equal(res.status, 200, path);
      assert.match(res.headers.get("content-type")!, type);
      await res.body?.cancel();
    }
    assert.doesNotMatch(html, /https?:\/\//, "nothing is loaded from elsewhere");
    const models = await app.request("/v1/models");
    assert.equal(models.status, 401);
    await models.body?.cancel();
    const js = await (await app.request("/playground/app.js")).text();
    assert.doesNotMatch(js, /innerHTML|outerHTML|insertAdjacentHTML|document\.write/);
  } finally {
    await rt.close();
  }
});
