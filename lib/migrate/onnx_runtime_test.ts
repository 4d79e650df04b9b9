// Tests of the optional ONNX part: installed, it is the real onnxruntime-node and runs the
// committed reference graph; left out of the installation (the serving deno.json, which does not
// import it, as in an image built without KVRELAY_ONNX=1), loading it is a typed error.
import assert from "node:assert/strict";
import ort from "./onnx_runtime.ts";
import { readProjectorMeta } from "./artifact.ts";

const repo = new URL("../../", import.meta.url).pathname;
const mlp = `${repo}models/projectors/tiny-fast--tiny-powerful-mlp`;

Deno.test("the ONNX part, installed, opens the reference projector's graph with projector.json's names", async () => {
  const meta = await readProjectorMeta(mlp);
  const session = await ort.InferenceSession.create(`${mlp}/${meta.onnx!.file}`);
  try {
    assert.deepEqual(
      [...session.inputNames].sort(),
      [meta.onnx!.inputs.k, meta.onnx!.inputs.v].sort(),
    );
    assert.deepEqual(
      [...session.outputNames].sort(),
      [meta.onnx!.outputs.k, meta.onnx!.outputs.v].sort(),
    );
  } finally {
    await session.release();
  }
});

Deno.test("loadOnnxRuntime() throws OnnxRuntimeMissingError when the installation leaves the part out", async () => {
  // What `deno task start` and a default image (no KVRELAY_ONNX=1) have: the serving deno.json,
  // which leaves onnxruntime-node to deno.dev.json (run here with a copy of it and no lockfile,
  // against the normal module cache).
  const dir = await Deno.makeTempDir();
  try {
    const cfg = JSON.parse(await Deno.readTextFile(`${repo}deno.json`));
    assert.equal(cfg.imports["onnxruntime-node"], undefined, "deno.json imports onnxruntime-node");
    await Deno.writeTextFile(`${dir}/deno.json`, JSON.stringify(cfg));
    const code = `
      import { loadOnnxRuntime } from "${repo}lib/migrate/onnx.ts";
      try { await loadOnnxRuntime("p.onnx"); console.log("LOADED"); }
      catch (e) { console.log(JSON.stringify({ name: e.name, message: e.message })); }`;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", "--cached-only", "--no-lock", "--config", `${dir}/deno.json`, code],
      cwd: dir,
      env: { DENO_NO_UPDATE_CHECK: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(out.stdout).trim();
    const err = new TextDecoder().decode(out.stderr);
    assert.notEqual(text, "LOADED", "onnxruntime-node loaded without its import");
    assert.ok(text !== "", `no output; stderr: ${err}`);
    const r = JSON.parse(text.split("\n").at(-1)!);
    assert.equal(r.name, "OnnxRuntimeMissingError");
    assert.match(
      r.message,
      /^p\.onnx: the onnx projector kind needs the optional onnxruntime-node/,
    );
    assert.match(r.message, /KVRELAY_ONNX=1/);
    assert.match(r.message, /onnxruntime-node/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
