// projector.json / weights.safetensors validation: a written artifact reads back identically and
// expands to the right dense matrices; hostile inputs (bad widths, fingerprints, layer maps,
// tensor shapes/dtypes/extras, non-finite weights) are ProjectorFormatErrors quoting the problem.

import assert from "node:assert/strict";
import { encodeSafetensors, type SafetensorsEntry } from "../model/mod.ts";
import {
  denseWeights,
  type LayerWeights,
  parseProjectorMeta,
  type ProjectorMeta,
  readLinearWeights,
  readProjectorMeta,
  writeProjector,
} from "./artifact.ts";
import { ProjectorFormatError } from "./errors.ts";

function ref(name: string, layers: number, heads: number, dim: number, fp: string) {
  return {
    name,
    fingerprint: fp.repeat(64),
    architecture: "Qwen3ForCausalLM",
    layers,
    kv_heads: heads,
    head_dim: dim,
    rope_theta: 10000,
    rope_scaling: null,
    qk_norm: true,
  };
}

/** source 3 layers × 1 head × 2 dims (width 6) → target 2 layers × 2 heads × 2 dims (width 8) */
function meta(): ProjectorMeta {
  return parseProjectorMeta({
    format: "kvrelay-projector",
    version: 1,
    kind: "linear",
    source: ref("s", 3, 1, 2, "a"),
    target: ref("t", 2, 2, 2, "b"),
    tokenizer_fingerprint: "c".repeat(64),
    features: { layout: "test", source_width: 6, target_width: 8 },
    layer_map: [
      {
        target_layer: 0,
        k_source_layers: [0, 2],
        v_source_layers: [1],
        k_lambda: 0.1,
        v_lambda: 0,
        k_heldout_r2: 0.5,
        v_heldout_r2: null,
      },
      {
        target_layer: 1,
        k_source_layers: [0, 1, 2],
        v_source_layers: [2],
        k_lambda: 1,
        v_lambda: 1,
        k_heldout_r2: 0.9,
        v_heldout_r2: 0.8,
      },
    ],
    lambda: { mode: "auto", grid: [0.1, 1], scale: "relative" },
    source_layer_selection: "auto",
    repair_default: 8,
    temperature: 1.1,
    calibration: { corpus: ["x"], tokens: 10 },
    quality: null,
  });
}

function weights(m: ProjectorMeta): LayerWeights[] {
  let x = 0;
  const f = (n: number) => Float32Array.from({ length: n }, () => ++x);
  return m.layer_map!.map((e) => ({
    kWeight: f(4 * e.k_source_layers.length * 2),
    kBias: f(4),
    vWeight: f(4 * e.v_source_layers.length * 2),
    vBias: f(4),
  }));
}

Deno.test("writeProjector() then readLinearWeights() round-trips and denseWeights() places source layers", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const m = meta(), w = weights(m);
    await writeProjector(dir, m, w);
    const m2 = await readProjectorMeta(dir);
    assert.deepEqual(m2, m);
    const w2 = await readLinearWeights(dir, m2);
    assert.deepEqual(w2, w);
    const d = denseWeights(m2, w2);
    // target layer 0, output 1, K: source layers [0, 2] → columns 0..1 and 4..5, zeros at 2..3
    const row = d.wk.subarray(1 * 6, 2 * 6);
    const lw = w[0].kWeight.subarray(1 * 4, 2 * 4);
    assert.deepEqual([...row], [lw[0], lw[1], 0, 0, lw[2], lw[3]]);
    // target layer 1, output 0 is global row 4; V uses source layer 2 only
    assert.deepEqual([...d.wv.subarray(4 * 6, 5 * 6)], [
      0,
      0,
      0,
      0,
      w[1].vWeight[0],
      w[1].vWeight[1],
    ]);
    assert.equal(d.bk[5], w[1].kBias[1]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("parseProjectorMeta() throws ProjectorFormatError for hostile metadata", () => {
  const good = meta();
  const cases: [string, (m: Record<string, unknown> & ProjectorMeta) => void, RegExp][] = [
    ["width", (m) => (m.features.source_width = 7), /source_width/],
    ["fingerprint", (m) => (m.source.fingerprint = "XYZ"), /fingerprint/],
    ["layer count", (m) => m.layer_map!.pop(), /layer_map/],
    ["layer order", (m) => (m.layer_map![1].target_layer = 0), /target_layer/],
    ["source layer range", (m) => (m.layer_map![0].k_source_layers = [0, 3]), /k_source_layers/],
    ["source layer order", (m) => (m.layer_map![0].k_source_layers = [2, 0]), /k_source_layers/],
    ["odd head_dim", (m) => (m.target.head_dim = 3), /head_dim/],
    ["kind", (m) => ((m as Record<string, unknown>).kind = "pickle"), /kind/],
    ["onnx without section", (m) => (m.kind = "onnx"), /onnx/],
    ["temperature", (m) => (m.temperature = -1), /temperature/],
    ["unknown key", (m) => ((m as Record<string, unknown>).extra = 1), /extra|unrecognized/i],
    ["onnx path escape", (m) => {
      m.kind = "onnx";
      m.onnx = {
        file: "../../etc/passwd.onnx",
        inputs: { k: "a", v: "b" },
        outputs: { k: "c", v: "d" },
      };
    }, /onnx\.file/],
  ];
  for (const [name, mutate, re] of cases) {
    const m = structuredClone(good) as Record<string, unknown> & ProjectorMeta;
    mutate(m);
    assert.throws(
      () => parseProjectorMeta(m, "p.json"),
      (e: unknown) => e instanceof ProjectorFormatError && re.test(e.message),
      name,
    );
  }
  assert.throws(() => parseProjectorMeta(null), ProjectorFormatError);
  assert.throws(() => parseProjectorMeta([1, 2]), ProjectorFormatError);
});

Deno.test("readLinearWeights() throws ProjectorFormatError for wrong shapes, dtypes, extra tensors and NaN", async () => {
  const m = meta(), w = weights(m);
  const entries = (): SafetensorsEntry[] =>
    m.layer_map!.flatMap((e, t) =>
      (["k", "v"] as const).flatMap((kv) => {
        const W = kv === "k" ? w[t].kWeight : w[t].vWeight,
          B = kv === "k" ? w[t].kBias : w[t].vBias;
        const n = (kv === "k" ? e.k_source_layers : e.v_source_layers).length * 2;
        return [
          {
            name: `layers.${t}.${kv}.weight`,
            dtype: "F32" as const,
            shape: [4, n],
            data: new Uint8Array(W.slice().buffer),
          },
          {
            name: `layers.${t}.${kv}.bias`,
            dtype: "F32" as const,
            shape: [4],
            data: new Uint8Array(B.slice().buffer),
          },
        ];
      })
    );
  const dir = await Deno.makeTempDir();
  try {
    const check = async (list: SafetensorsEntry[], re: RegExp) => {
      await Deno.writeFile(`${dir}/weights.safetensors`, encodeSafetensors(list));
      await assert.rejects(
        readLinearWeights(dir, m),
        (e: unknown) => e instanceof ProjectorFormatError && re.test(e.message),
      );
    };
    let l = entries();
    l[4] = { ...l[4], shape: [l[4].shape[1], 4] };
    await check(l, /shape/);
    l = entries();
    l[1] = { ...l[1], dtype: "F16", shape: [8] };
    await check(l, /F16/);
    l = entries();
    l.push({ name: "evil", dtype: "F32", shape: [1], data: new Uint8Array(4) });
    await check(l, /unexpected tensors/);
    l = entries().slice(1);
    await check(l, /missing tensor/);
    l = entries();
    new Float32Array(l[3].data.buffer)[0] = NaN;
    await check(l, /non-finite/);
    await Deno.writeFile(`${dir}/weights.safetensors`, new Uint8Array([1, 2, 3]));
    await assert.rejects(readLinearWeights(dir, m), ProjectorFormatError);
    await Deno.writeTextFile(`${dir}/projector.json`, "{not json");
    await assert.rejects(
      readProjectorMeta(dir),
      (e: unknown) => e instanceof ProjectorFormatError && /not JSON/.test(e.message),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
