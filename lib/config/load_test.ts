// Tests of the config loader: the bundled config parses with every tier; every problem of a bad
// config is listed by path (schema, cross-field, env); env overrides PORT/HOST; secrets come from
// the env variables the file names, never from the file.
import assert from "node:assert/strict";
import { BUNDLED_CONFIG_PATH, ConfigError, loadConfig, parseConfig } from "./mod.ts";

const noEnv = () => undefined;

Deno.test("loadConfig() reads the bundled config/local.json with the three demo tiers", async () => {
  const cfg = await loadConfig(BUNDLED_CONFIG_PATH, noEnv);
  assert.deepEqual(cfg.tierOrder, ["fast", "balanced", "powerful"]);
  assert.equal(cfg.defaultTier, "fast");
  assert.ok(cfg.tiers.fast.model.endsWith("/models/tiny-fast"), cfg.tiers.fast.model);
  assert.ok(cfg.tiers.fast.model.startsWith("/"));
  assert.equal(cfg.server.port, 8080);
  assert.deepEqual(cfg.secrets.apiKeys, []);
  assert.equal(cfg.secrets.snapshotKey, null);
});

Deno.test("loadConfig() uses KVRELAY_CONFIG when no path is given", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${dir}/c.json`, JSON.stringify({ tiers: { solo: { model: "m" } } }));
    const cfg = await loadConfig(
      undefined,
      (n) => n === "KVRELAY_CONFIG" ? `${dir}/c.json` : undefined,
    );
    assert.deepEqual(cfg.tierOrder, ["solo"]);
    assert.equal(cfg.tiers.solo.model, `${dir}/m`);
    assert.equal(cfg.tiers.solo.concurrency, 2);
    assert.equal(cfg.store.kind, "memory");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("parseConfig() lists every problem by path when several fields are wrong", () => {
  const bad = {
    tiers: {
      fast: {
        model: "",
        backend: "tpu",
        threads: -1,
        default_max_tokens: 900,
        max_new_tokens: 800,
      },
      big: { model: "x", concurrency: 0, extra: 1 },
    },
    default_tier: "nope",
    projectors: [{ from: "fast", to: "ghost", path: "p" }],
    store: { kind: "s3" },
  };
  try {
    parseConfig(bad, { env: noEnv });
    assert.fail("expected ConfigError");
  } catch (e) {
    assert.ok(e instanceof ConfigError);
    const paths = e.problems.map((p) => p.split(":")[0]);
    for (
      const want of [
        "tiers.fast.model",
        "tiers.fast.backend",
        "tiers.fast.threads",
        "tiers.big.concurrency",
        "tiers.big",
        "store.kind",
      ]
    ) {
      assert.ok(paths.includes(want), `missing ${want} in ${JSON.stringify(e.problems)}`);
    }
  }
  try {
    parseConfig({
      tiers: { fast: { model: "m", default_max_tokens: 900, max_new_tokens: 800 } },
      default_tier: "nope",
      projectors: [{ from: "fast", to: "ghost", path: "p" }],
      router: { rules: [{ tier: "zzz" }] },
    }, { env: noEnv });
    assert.fail("expected ConfigError");
  } catch (e) {
    assert.ok(e instanceof ConfigError);
    const text = e.problems.join("\n");
    for (
      const want of [
        "default_tier",
        "tiers.fast.default_max_tokens",
        "projectors.0.to",
        "router.rules.0.tier",
      ]
    ) {
      assert.ok(text.includes(want), `missing ${want} in ${text}`);
    }
    assert.match(e.message, /^invalid config inline:/);
  }
});

Deno.test("parseConfig() takes PORT/HOST and secrets from the env, and reports a bad PORT or short key", () => {
  const env: Record<string, string> = {
    PORT: "9191",
    HOST: "127.0.0.1",
    MY_KEYS: "a, b ,,c",
    MY_HMAC: "0123456789abcdef0",
  };
  const cfg = parseConfig({
    tiers: { t: { model: "/m" } },
    auth: { api_keys_env: "MY_KEYS", snapshot_hmac_key_env: "MY_HMAC" },
  }, { env: (n) => env[n] });
  assert.equal(cfg.server.port, 9191);
  assert.equal(cfg.server.host, "127.0.0.1");
  assert.deepEqual(cfg.secrets.apiKeys, ["a", "b", "c"]);
  assert.equal(new TextDecoder().decode(cfg.secrets.snapshotKey!), "0123456789abcdef0");
  assert.throws(
    () =>
      parseConfig({ tiers: { t: { model: "/m" } }, store: { kind: "redis" } }, {
        env: (n) => ({ PORT: "http", KVRELAY_SNAPSHOT_KEY: "short" })[n],
      }),
    (e: unknown) => {
      assert.ok(e instanceof ConfigError);
      assert.equal(e.problems.length, 3, e.problems.join("\n"));
      assert.match(e.problems.join("\n"), /env PORT/);
      assert.match(
        e.problems.join("\n"),
        /KVRELAY_SNAPSHOT_KEY: snapshot HMAC key must be at least 16 bytes/,
      );
      assert.match(e.problems.join("\n"), /KVRELAY_REDIS_URL/);
      return true;
    },
  );
});

Deno.test("parseConfig() reads the /metrics key from auth.metrics_key_env, and refuses the field naming an unset variable", () => {
  const base = { tiers: { t: { model: "/m" } } };
  assert.equal(parseConfig(base, { env: () => undefined }).secrets.metricsKey, null);
  const withKey = { ...base, auth: { metrics_key_env: "SCRAPE_KEY" } };
  const env: Record<string, string> = { SCRAPE_KEY: "s3cret" };
  assert.equal(parseConfig(withKey, { env: (n) => env[n] }).secrets.metricsKey, "s3cret");
  assert.throws(
    () => parseConfig(withKey, { env: (n) => ({ SCRAPE_KEY: "" })[n] }),
    (e: unknown) => e instanceof ConfigError && /env SCRAPE_KEY: required/.test(e.message),
  );
  assert.throws(
    () => parseConfig({ ...base, auth: { metrics_key_env: "" } }, { env: () => undefined }),
    (e: unknown) => e instanceof ConfigError && /auth\.metrics_key_env/.test(e.message),
  );
});

Deno.test("loadConfig() reports an unreadable file and invalid JSON as ConfigError", async () => {
  await assert.rejects(loadConfig("/nonexistent/kvrelay.json", noEnv), ConfigError);
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${dir}/bad.json`, "{tiers:");
    await assert.rejects(loadConfig(`${dir}/bad.json`, noEnv), /not valid JSON/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("loadConfig() accepts every deployment config in deploy/configs (with its secrets set)", async () => {
  const dir = new URL("../../deploy/configs/", import.meta.url).pathname;
  const env: Record<string, string> = { KVRELAY_REDIS_URL: "redis://127.0.0.1:6379" };
  let n = 0;
  for await (const e of Deno.readDir(dir)) {
    if (!e.name.endsWith(".json")) continue;
    const cfg = await loadConfig(`${dir}${e.name}`, (k) => env[k]);
    assert.equal(cfg.store.kind, "redis");
    assert.ok(cfg.deploy !== undefined && cfg.tierOrder.includes(cfg.deploy.tier), e.name);
    assert.equal(e.name.split(".")[0], cfg.deploy.tier, e.name);
    n++;
  }
  assert.equal(n, 6); // three tiers, each a CPU config and its rendered CUDA variant
});

Deno.test("parseConfig() quotes the value each schema problem is about", () => {
  assert.throws(
    () =>
      parseConfig({ tiers: { big: { model: "m", max_context: 65536, kv_dtype: "f8" } } }, {
        env: () => undefined,
      }),
    (e: unknown) => {
      assert.ok(e instanceof ConfigError);
      const byPath = Object.fromEntries(e.problems.map((p) => [p.split(":")[0], p]));
      assert.match(byPath["tiers.big.max_context"], /32768.* \(got 65536\)$/);
      assert.match(byPath["tiers.big.kv_dtype"], / \(got "f8"\)$/);
      return true;
    },
  );
});
