// End-to-end backend selection of the real server process (functions/main.ts): a tier with
// `backend: cuda` on a machine without a usable CUDA device refuses to start with the probe's
// reason and exit status 2; `cpu` and `auto` tiers start, `auto` falls back to the CPU with the
// reason logged once, and /readyz and /metrics report each tier's backend and device.
import assert from "node:assert/strict";
import { autoFallbackWords, probeBackend } from "../lib/native/mod.ts";
import { startServer, writeConfig } from "./e2e_support.ts";

const root = new URL("../", import.meta.url).pathname;

Deno.test("the server refuses a cuda tier without a usable device with the probe's reason and exit 2", async () => {
  const reason = probeBackend("cuda", 0).info; // the oracle: the library's own answer
  assert.equal(probeBackend("cuda", 0).ok, false, "this test needs a machine without CUDA");
  const path = await writeConfig({ fast: "tiny-fast", powerful: "tiny-powerful" }, {}, {});
  const cfg = JSON.parse(await Deno.readTextFile(path));
  cfg.tiers.powerful.backend = "cuda";
  await Deno.writeTextFile(path, JSON.stringify(cfg));
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", `${root}functions/main.ts`],
      env: { KVRELAY_CONFIG: path, PORT: "0" },
      stdout: "null",
      stderr: "piped",
    }).output();
    const err = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 2, err);
    assert.match(
      err,
      /refusing to start: tier "powerful": backend cuda \(device 0\) is unavailable: /,
    );
    assert.ok(err.includes(reason), err);
    assert.doesNotMatch(err, /\n\s+at /);
  } finally {
    await Deno.remove(path.slice(0, path.lastIndexOf("/")), { recursive: true });
  }
});

Deno.test("cpu and auto tiers start on the CPU; /readyz and /metrics name each tier's backend and device", async () => {
  const cpu = probeBackend("cpu").info, cuda = probeBackend("cuda").info;
  const path = await writeConfig({ fast: "tiny-fast", balanced: "tiny-balanced" });
  const cfg = JSON.parse(await Deno.readTextFile(path));
  cfg.tiers.fast.backend = "cpu";
  cfg.tiers.balanced.backend = "auto";
  await Deno.writeTextFile(path, JSON.stringify(cfg));
  const server = await startServer("functions/main.ts", { KVRELAY_CONFIG: path });
  try {
    const ready = await (await fetch(`${server.base}/readyz`)).json();
    assert.deepEqual(ready.tiers, ["fast", "balanced"]);
    for (const t of ["fast", "balanced"]) {
      assert.deepEqual(ready.backends[t], { backend: "cpu", device: 0, info: `${cpu}, 1 threads` });
    }
    const metrics = await (await fetch(`${server.base}/metrics`)).text();
    assert.match(metrics, /# TYPE kvrelay_tier_backend_info gauge/);
    for (const t of ["fast", "balanced"]) {
      assert.ok(
        metrics.includes(`kvrelay_tier_backend_info{backend="cpu",device="0",tier="${t}"} 1`),
        metrics,
      );
    }
  } finally {
    const { stderr } = await server.stop();
    const lines = stderr.split("\n").filter((l) => l.includes("backend auto"));
    assert.deepEqual(lines, [
      `kvrelay: backend auto → cpu for tier balanced (${autoFallbackWords(cuda)})`,
    ]);
    await Deno.remove(path.slice(0, path.lastIndexOf("/")), { recursive: true });
  }
});
