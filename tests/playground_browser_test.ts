// The playground (GET /) in a real headless browser: Debian's chromium driven by playwright-core
// against a real kvrelay process with API keys on. It loads the page, enters the key, streams an
// answer (text equal to the same request answered by the API without streaming), checks the
// per-answer fields (tier, route, TTFT, tokens/s), then asks a follow-up that escalates the
// conversation to a higher tier and checks that the page shows the migration of the lower tier's
// cached prompt and the tier's live metrics. Skipped only where chromium is absent and the run is
// not CI (CI, or KVRELAY_REQUIRE_BROWSER=1 as .ci/run sets, makes a missing browser a failure).
import assert from "node:assert/strict";
import { chromium, type Page } from "playwright-core";
import { startServer, writeConfig } from "./e2e_support.ts";

const CHROMIUM = Deno.env.get("KVRELAY_CHROMIUM") ?? "/usr/bin/chromium";
const required = Boolean(Deno.env.get("CI") || Deno.env.get("KVRELAY_REQUIRE_BROWSER"));
const present = await Deno.stat(CHROMIUM).then(() => true, () => false);
if (!present && !required) {
  console.warn(
    `playground browser test skipped: no chromium at ${CHROMIUM} (apt-get install -y chromium, ` +
      "or set KVRELAY_CHROMIUM); in CI it runs and fails instead",
  );
}

const root = new URL("../", import.meta.url).pathname;
const KEY = "playground-test-key";
// No router keyword and under 32 tokens: the default tier (fast); long enough that its chat prompt
// fills two 16-token prefix-cache chunks, so the follow-up has more than the repair length to reuse.
const FIRST = "The ship sailed out of the harbour at dawn, and the crew watched the town grow " +
  "small behind them. <img src=x>";
const FOLLOW_UP = "Explain why they left."; // "explain" routes to powerful

const FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

async function field(page: Page, answer: number, name: string): Promise<string> {
  return (await page.locator("#log li.assistant").nth(answer).locator(`[data-field="${name}"]`)
    .textContent()) ?? "";
}

/** Waits until the answer's finishing chunk has filled its speed fields. */
async function finished(page: Page, answer: number): Promise<void> {
  await page.locator("#log li.assistant").nth(answer).locator('[data-field="ttft"]')
    .filter({ hasText: /ms$/ }).waitFor({ timeout: 60_000 });
}

Deno.test({
  name:
    "playground: streams an answer with its tier, route, TTFT and tokens/s; a follow-up shows escalation and migration",
  ignore: !present && !required,
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    assert.ok(present, `chromium is required here but missing at ${CHROMIUM}`);
    const config = await writeConfig(
      { fast: "tiny-fast", powerful: "tiny-powerful" },
      { default_max_tokens: 16, sampling: { temperature: 0 } },
      {
        default_tier: "fast",
        projectors: [{
          from: "fast",
          to: "powerful",
          path: `${root}models/projectors/tiny-fast--tiny-powerful`,
          min_quality: 0.5,
        }],
        prefix_cache: { enabled: true, chunk_tokens: 16 },
      },
    );
    const server = await startServer("functions/main.ts", {
      KVRELAY_CONFIG: config,
      KVRELAY_API_KEYS: KEY,
    });
    const profile = await Deno.makeTempDir({ prefix: "kvrelay-chromium-" });
    const context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: FLAGS,
    });
    try {
      const page = context.pages()[0] ?? await context.newPage();
      const pageErrors: string[] = [];
      page.on("pageerror", (e) => pageErrors.push(e.message));
      await page.goto(`${server.base}/`);
      await page.locator("body[data-ready=true]").waitFor();
      // Keys are on: the page says so until one is entered.
      assert.match(await page.locator("#status").textContent() ?? "", /API key/);
      await page.locator("#api-key").fill(KEY);
      await page.locator("#api-key").dispatchEvent("change");
      await page.locator('#tier option[value="powerful"]').waitFor({ state: "attached" });

      // 1. A streamed answer on the routed tier.
      await page.locator("#prompt").fill(FIRST);
      await page.locator("#send").click();
      const text = page.locator("#log li.assistant .text").first();
      await text.filter({ hasText: /\S/ }).waitFor({ timeout: 60_000 });
      await finished(page, 0);
      const oracle = await (await fetch(`${server.base}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
        body: JSON.stringify({
          model: "fast",
          messages: [{ role: "user", content: FIRST }],
          max_tokens: 48,
          temperature: 0,
        }),
      })).json();
      assert.equal(await text.textContent(), oracle.choices[0].message.content);
      assert.equal(await field(page, 0, "tier"), "fast");
      assert.equal(await field(page, 0, "route"), "default");
      assert.equal(await field(page, 0, "escalation"), "none");
      assert.match(await field(page, 0, "ttft"), /^\d+\.\d ms$/);
      assert.match(await field(page, 0, "tps"), /^\d+\.\d$/);
      // The user's markup is shown as text, never parsed.
      assert.equal(await page.locator("#log li.user .text").first().textContent(), FIRST);
      assert.equal(await page.locator("#log img").count(), 0);

      // 2. The follow-up escalates the conversation; the higher tier migrates fast's cached prompt.
      await page.locator("#prompt").fill(FOLLOW_UP);
      await page.locator("#prompt").press("Enter");
      await finished(page, 1);
      assert.equal(await field(page, 1, "tier"), "powerful");
      assert.equal(await field(page, 1, "route"), "rule");
      assert.equal(await field(page, 1, "escalation"), "fast → powerful");
      assert.equal(await field(page, 1, "migration"), "migrated from fast");
      assert.ok(Number(await field(page, 1, "reused")) > 0);
      // The tier table (from /metrics) counts the migration into powerful.
      await page.locator('#metrics tr[data-tier="powerful"] td').nth(7).filter({
        hasText: /^[1-9]/,
      })
        .waitFor({ timeout: 10_000 });
      assert.deepEqual(pageErrors, []);
    } finally {
      await context.close();
      await Deno.remove(profile, { recursive: true }).catch(() => {});
      await server.stop();
    }
  },
});
