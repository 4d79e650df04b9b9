// RoPE parameters are validated by one native function (rope.cpp check_rope) that both of its
// callers use: model load (kvr_model_load) and the projector (kvr_projector_create). Each case
// below goes through both raw entry points with the same params bytes and must get the same
// status and reason; theta in (0, 1] is valid for both (the two used to disagree: > 0 vs > 1).

import assert from "node:assert/strict";
import { encodeModelParams } from "./layout.ts";
import { openNativeLibrary } from "./library.ts";
import { checkpoint, DEMO_DIRS, rawModelLoad } from "./test_helpers.ts";

/** Field offsets of kvr_model_params (kvrelay.h). */
const OFF = { theta: 36, scaling: 40, factor: 44, low: 48, high: 52, orig: 56 } as const;

type Patch = Partial<Record<keyof typeof OFF, number>>;

Deno.test("RoPE params get the same verdict and reason from kvr_model_load and kvr_projector_create", async () => {
  const lib = openNativeLibrary();
  const ckpt = await checkpoint(DEMO_DIRS[0]);
  const c = ckpt.config;
  const width = c.numLayers * c.numKvHeads * c.headDim;
  const w = new Float32Array(width * width), b = new Float32Array(width);
  const params = (patch: Patch) => {
    const p = encodeModelParams(c, "f32", 1);
    const v = new DataView(p.buffer);
    for (const [k, x] of Object.entries(patch) as [keyof typeof OFF, number][]) {
      if (k === "scaling" || k === "orig") v.setUint32(OFF[k], x, true);
      else v.setFloat32(OFF[k], x, true);
    }
    return p;
  };
  const load = (p: Uint8Array) => {
    const { status: st, model } = rawModelLoad(lib, ckpt, p);
    const msg = lib.lastError();
    if (model) lib.symbols.kvr_model_free(model);
    return { st, msg: st === 0 ? "" : msg };
  };
  const project = (p: Uint8Array) => {
    const out = new BigUint64Array(1);
    const n = BigInt(w.length), nb = BigInt(b.length);
    const st = lib.symbols.kvr_projector_create(p, p, w, n, b, nb, w, n, b, nb, out);
    const msg = lib.lastError();
    if (st === 0) lib.symbols.kvr_projector_free(Deno.UnsafePointer.create(out[0]));
    return { st, msg: st === 0 ? "" : msg };
  };
  const llama3 = { scaling: 2, factor: 8, low: 1, high: 4, orig: 8192 };
  const cases: [string, Patch, number, RegExp | null][] = [
    ["theta 10000", {}, 0, null],
    ["theta 0.5", { theta: 0.5 }, 0, null],
    ["theta 1", { theta: 1 }, 0, null],
    ["llama3", llama3, 0, null],
    ["theta 0", { theta: 0 }, -1, /^rope_theta must be finite and > 0, got 0$/],
    ["theta -2", { theta: -2 }, -1, /^rope_theta must be finite and > 0, got -2$/],
    ["theta NaN", { theta: NaN }, -1, /^rope_theta must be finite and > 0, got nan$/],
    ["theta inf", { theta: Infinity }, -1, /^rope_theta must be finite and > 0, got inf$/],
    [
      "scaling 7",
      { scaling: 7 },
      -5,
      /^unsupported rope_scaling 7 \(0 none, 1 linear, 2 llama3\)$/,
    ],
    ["linear factor 0", { scaling: 1, factor: 0 }, -1, /^rope_factor must be finite and > 0/],
    ["llama3 high = low", { ...llama3, high: 1 }, -1, /rope_high_freq_factor 1 must exceed/],
    ["llama3 low 0", { ...llama3, low: 0 }, -1, /low\/high freq factors must be finite and > 0/],
    ["llama3 orig 0", { ...llama3, orig: 0 }, -1, /^llama3 rope_original_max_position must be/],
  ];
  for (const [name, patch, status, re] of cases) {
    const p = params(patch);
    const a = load(p), pr = project(p);
    assert.equal(a.st, status, `${name}: model load ${a.msg}`);
    assert.equal(pr.st, status, `${name}: projector ${pr.msg}`);
    if (re === null) continue;
    assert.match(a.msg, re, name);
    // the projector names itself and the side, then gives the same reason
    assert.equal(pr.msg, `kvr_projector_create: source ${a.msg}`, name);
  }
});
