// Tests of the deployment renderer: the committed files under deploy/ are exactly what the configs
// render; every Knative/Cloud Run manifest read back from disk validates against the maintained
// Knative schema and carries the served tier's settings (read straight from the config JSON, not
// from the renderer's spec); RunPod bodies match the transcribed API; Modal files are valid Python;
// configs a platform cannot take are refused naming the field.
import assert from "node:assert/strict";
import { Service } from "@kubernetes-models/knative/serving.knative.dev/v1/Service";
import { parse } from "yaml";
import { ConfigError, loadConfig } from "../../lib/config/mod.ts";
import { renderDeployments, strayFiles } from "./render.ts";
import { runpodSchema } from "./runpod.ts";
import { deploymentSpec, RenderError } from "./spec.ts";
import { cloudRunService } from "./cloudrun.ts";
import { knativeService } from "./knative.ts";

const root = new URL("../../", import.meta.url).pathname;
const NAMES = ["balanced", "fast", "powerful"];

// deno-lint-ignore no-explicit-any
type Json = any;
const readJson = async (p: string): Promise<Json> =>
  JSON.parse(await Deno.readTextFile(`${root}${p}`));
const readYaml = async (p: string): Promise<Json> => parse(await Deno.readTextFile(`${root}${p}`));

/** Requests a tier runs at once, from its config file as written (the schema's defaults: batching
 *  on, max_batch 64): a batching tier steps max_batch rows together; without batching, its
 *  concurrency slots. */
function running(tier: { batching?: boolean; max_batch?: number; concurrency: number }): number {
  return (tier.batching ?? true) ? (tier.max_batch ?? 64) : tier.concurrency;
}

Deno.test("renderDeployments() output equals the committed deploy/ files (else: deno task deploy render)", async () => {
  const files = await renderDeployments(root);
  for (const [path, text] of files) {
    const committed = await Deno.readTextFile(`${root}${path}`).catch(() => "(missing)");
    assert.equal(committed, text, `${path} is stale: run \`deno task deploy render\``);
  }
  assert.deepEqual(await strayFiles(root, files), []);
  // 3 configs × (1 CUDA config + 2 variants × 4 platforms)
  assert.equal(files.size, NAMES.length * 9);
});

for (const platform of ["knative", "cloudrun"] as const) {
  Deno.test(`${platform} manifests validate against the Knative schema and carry the tier's settings`, async () => {
    for (const name of NAMES) {
      const src = await readJson(`deploy/configs/${name}.json`);
      const tier = src.tiers[src.deploy.tier];
      for (const gpu of [false, true]) {
        const file = `deploy/${platform}/${name}${
          gpu ? (platform === "knative" ? "-cuda" : "-l4") : ""
        }.yaml`;
        const obj = await readYaml(file);
        new Service(obj).validate(); // throws on any schema violation
        assert.equal(obj.kind, "Service", file);
        const ann = obj.spec.template.metadata.annotations;
        const spec = obj.spec.template.spec;
        const c = spec.containers[0];
        const minKey = platform === "knative"
          ? "autoscaling.knative.dev/min-scale"
          : "autoscaling.knative.dev/minScale";
        assert.equal(ann[minKey], String(src.deploy.min_scale ?? 0), file);
        if (platform === "knative") {
          assert.equal(ann["autoscaling.knative.dev/metric"], "concurrency");
          assert.equal(ann["autoscaling.knative.dev/target"], String(running(tier)), file);
          assert.equal(spec.containerConcurrency, running(tier) + tier.queue_depth, file);
          assert.equal(c.readinessProbe.httpGet.path, "/readyz");
          // Knative's pod termination grace is timeoutSeconds: the drain must fit in it.
          assert.ok(src.server.shutdown_grace_ms / 1000 < spec.timeoutSeconds, file);
        } else {
          assert.equal(spec.containerConcurrency, running(tier), file);
          assert.equal(c.startupProbe.httpGet.path, "/readyz");
          assert.ok(src.server.shutdown_grace_ms <= 8000, "Cloud Run kills 10 s after SIGTERM");
        }
        assert.equal(spec.timeoutSeconds, tier.request_timeout_ms / 1000, file);
        assert.equal(c.livenessProbe.httpGet.path, "/healthz");
        assert.deepEqual(c.args, [`functions/${src.deploy.function}/main.ts`]);
        assert.equal(c.image.endsWith(gpu ? ":cuda" : ":cpu"), true, file);
        // Secrets: exactly the env names the config reads, each from a secret, none inline.
        const secretEnv = c.env.filter((e: Json) => e.valueFrom).map((e: Json) => e.name).sort();
        assert.deepEqual(
          secretEnv,
          [
            src.auth.api_keys_env,
            src.store.url_env,
            src.auth.snapshot_hmac_key_env,
            src.prefix_cache.tenant_salt_env,
          ].sort(),
        );
        assert.equal(c.resources.limits["nvidia.com/gpu"], gpu ? "1" : undefined, file);
        if (platform === "cloudrun") {
          assert.equal(
            spec.nodeSelector?.["run.googleapis.com/accelerator"],
            gpu ? "nvidia-l4" : undefined,
          );
        }
        // The config the container runs with: loadable, and on CUDA exactly when the image is.
        const cfgPath = c.env.find((e: Json) => e.name === "KVRELAY_CONFIG").value.replace(
          /^\/app\//,
          "",
        );
        const cfg = await loadConfig(
          `${root}${cfgPath}`,
          (k) => secretEnv.includes(k) ? "secret-value-of-16-bytes-or-more" : undefined,
        );
        for (const t of Object.values(cfg.tiers)) {
          assert.equal(t.backend, gpu ? "cuda" : "cpu", cfgPath);
        }
      }
    }
  });
}

Deno.test("runpod bodies match the transcribed RunPod REST API, GPU endpoints only for CUDA", async () => {
  for (const name of NAMES) {
    const src = await readJson(`deploy/configs/${name}.json`);
    for (const gpu of [false, true]) {
      const body = runpodSchema.parse(
        await readJson(`deploy/runpod/${name}${gpu ? "-cuda" : ""}.json`),
      );
      assert.equal(body.endpoint.computeType, gpu ? "GPU" : "CPU");
      assert.equal(body.endpoint.workersMin, src.deploy.min_scale);
      assert.equal(body.endpoint.scalerValue, running(src.tiers[src.deploy.tier]));
      assert.match(
        body.template.env.KVRELAY_SNAPSHOT_KEY,
        /^\{\{ RUNPOD_SECRET_KVRELAY_SNAPSHOT_KEY \}\}$/,
      );
    }
  }
});

const python = (() => {
  try {
    return new Deno.Command("python3", { args: ["-c", "pass"] }).outputSync().success;
  } catch {
    return false;
  }
})();

Deno.test({
  name: `modal apps are valid Python with the tier's concurrency and GPU${
    python ? "" : " (ignored: no python3 here)"
  }`,
  ignore: !python,
  fn: async () => {
    for (const name of NAMES) {
      const src = await readJson(`deploy/configs/${name}.json`);
      const tier = src.tiers[src.deploy.tier];
      for (const gpu of [false, true]) {
        const file = `deploy/modal/kvrelay_${name}${gpu ? "_cuda" : ""}.py`;
        // Parse with Python itself and pull the decorator keywords out of the syntax tree.
        const out = new Deno.Command("python3", {
          args: [
            "-c",
            `import ast, json, sys
tree = ast.parse(open(sys.argv[1]).read())
kw = {}
for node in ast.walk(tree):
    if isinstance(node, ast.FunctionDef):
        for d in node.decorator_list:
            if isinstance(d, ast.Call):
                for k in d.keywords:
                    try: kw[k.arg] = ast.literal_eval(k.value)
                    except ValueError: pass
print(json.dumps(kw))`,
            `${root}${file}`,
          ],
        }).outputSync();
        assert.ok(out.success, new TextDecoder().decode(out.stderr));
        const kw = JSON.parse(new TextDecoder().decode(out.stdout));
        assert.equal(kw.gpu, gpu ? "L4" : null, file);
        assert.equal(kw.target_inputs, running(tier), file);
        assert.equal(kw.max_inputs, running(tier) + tier.queue_depth, file);
        assert.equal(kw.min_containers, src.deploy.min_scale, file);
      }
    }
  },
});

Deno.test("deploymentSpec() and the platform renderers refuse configs a platform cannot run, naming the field", async () => {
  const base = await readJson("deploy/configs/fast.json");
  const withGrace = structuredClone(base);
  withGrace.server.shutdown_grace_ms = 15000;
  const spec = deploymentSpec("x.json", withGrace, "cpu");
  assert.throws(
    () => cloudRunService(spec),
    (e) => e instanceof RenderError && e.param === "server.shutdown_grace_ms",
  );
  knativeService(spec); // 15 s drain fits Knative's 60 s termination grace
  withGrace.server.shutdown_grace_ms = 59000;
  assert.throws(
    () => knativeService(deploymentSpec("x.json", withGrace, "cpu")),
    (e) => e instanceof RenderError && e.param === "server.shutdown_grace_ms",
  );
  const smallGpu = structuredClone(base);
  smallGpu.deploy.gpu = { cpu: 2, memory_mib: 16384 };
  assert.throws(
    () => cloudRunService(deploymentSpec("x.json", smallGpu, "cuda")),
    (e) => e instanceof RenderError && e.param === "deploy.gpu.cpu",
  );
  const noDeploy = structuredClone(base);
  delete noDeploy.deploy;
  assert.throws(
    () => deploymentSpec("x.json", noDeploy, "cpu"),
    (e) => e instanceof RenderError && e.param === "deploy",
  );
  const badTier = structuredClone(base);
  badTier.deploy.tier = "nope";
  assert.throws(
    () => deploymentSpec("x.json", badTier, "cpu"),
    (e) => e instanceof ConfigError && /deploy\.tier/.test(e.message),
  );
});

Deno.test("deno task deploy render --check exits 0 on the committed tree and 2 on an unknown platform", async () => {
  const run = (args: string[]) =>
    new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "--config",
        `${root}deno.dev.json`,
        `${root}deploy/render/main.ts`,
        ...args,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
  const ok = await run(["render", "--check"]);
  assert.equal(ok.code, 0, new TextDecoder().decode(ok.stdout));
  const bad = await run(["render", "--platform", "heroku"]);
  assert.equal(bad.code, 2);
  assert.match(new TextDecoder().decode(bad.stderr), /--platform: unknown platform "heroku"/);
});
