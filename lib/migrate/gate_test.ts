// migrationGate(): allow only when the stored quality at the judged repair length clears every
// threshold and the live pair matches; each refusal path returns its reason.

import assert from "node:assert/strict";
import { parseProjectorMeta, type ProjectorMeta } from "./artifact.ts";
import { migrationGate } from "./gate.ts";

function meta(quality: boolean): ProjectorMeta {
  const ref = (name: string, fp: string) => ({
    name,
    fingerprint: fp.repeat(64),
    architecture: "Qwen3ForCausalLM",
    layers: 1,
    kv_heads: 1,
    head_dim: 2,
    rope_theta: 10000,
    rope_scaling: null,
    qk_norm: true,
  });
  const m = (r: number, q: number) => ({
    nll: 4,
    recovered: r,
    kl: 0.01,
    kl_recovered: q,
    top1_agreement: 0.9,
    ttft_ms: 1,
  });
  return parseProjectorMeta({
    format: "kvrelay-projector",
    version: 1,
    kind: "linear",
    source: ref("s", "a"),
    target: ref("t", "b"),
    tokenizer_fingerprint: "c".repeat(64),
    features: { layout: "x", source_width: 2, target_width: 2 },
    layer_map: [{
      target_layer: 0,
      k_source_layers: [0],
      v_source_layers: [0],
      k_lambda: 0,
      v_lambda: 0,
      k_heldout_r2: null,
      v_heldout_r2: null,
    }],
    lambda: null,
    source_layer_selection: "all",
    repair_default: 8,
    temperature: 1.2,
    calibration: { corpus: [], tokens: 0 },
    quality: quality
      ? {
        file: "valid.txt",
        prefix: 192,
        continuation: 64,
        windows: 10,
        full_nll: 4,
        no_prefix_nll: 4.1,
        source_nll: 4.4,
        no_prefix_kl: 0.07,
        no_prefix_top1_agreement: 0.85,
        full_ttft_ms: 40,
        repair: { "1": m(0.5, 0.6), "8": m(0.9, 0.95) },
      }
      : null,
  });
}

const pair = {
  sourceFingerprint: "a".repeat(64),
  targetFingerprint: "b".repeat(64),
  sourceTokenizer: "c".repeat(64),
  targetTokenizer: "c".repeat(64),
};

Deno.test("migrationGate() allows a projector whose stored quality clears the thresholds", () => {
  const d = migrationGate(meta(true), {
    minKlRecovered: 0.9,
    minTop1Agreement: 0.85,
    minRecovered: 0.5,
  }, pair);
  assert.deepEqual(d, { allow: true, mode: "project", repair: 8, temperature: 1.2 });
  assert.deepEqual(
    migrationGate(null, {}, { ...pair, targetFingerprint: pair.sourceFingerprint }),
    { allow: true, mode: "copy", repair: 1, temperature: 1 },
  );
});

Deno.test("migrationGate() refuses with a reason when quality, pair or tokenizer do not fit", () => {
  const reason = (d: ReturnType<typeof migrationGate>) => (d.allow ? "allow" : d.reason);
  assert.equal(
    reason(migrationGate(meta(true), { minKlRecovered: 0.9, repair: 1 }, pair)),
    "quality_below_threshold",
  );
  assert.equal(
    reason(migrationGate(meta(true), { minKlRecovered: 0.99 })),
    "quality_below_threshold",
  );
  assert.equal(reason(migrationGate(meta(true), { repair: 32 })), "no_quality");
  assert.equal(reason(migrationGate(meta(false), {})), "no_quality");
  assert.equal(reason(migrationGate(null, {}, pair)), "no_projector");
  assert.equal(
    reason(migrationGate(meta(true), {}, { ...pair, targetTokenizer: "d".repeat(64) })),
    "tokenizer_mismatch",
  );
  assert.equal(
    reason(
      migrationGate(meta(true), {}, {
        ...pair,
        sourceTokenizer: "d".repeat(64),
        targetTokenizer: "d".repeat(64),
      }),
    ),
    "tokenizer_mismatch",
  );
  assert.equal(
    reason(migrationGate(meta(true), {}, { ...pair, sourceFingerprint: "e".repeat(64) })),
    "source_mismatch",
  );
  assert.equal(
    reason(migrationGate(meta(true), {}, { ...pair, targetFingerprint: "e".repeat(64) })),
    "target_mismatch",
  );
  const d = migrationGate(meta(true), { minTop1Agreement: 0.95 });
  assert.ok(!d.allow && /top1_agreement 0\.9000 at repair 8 < threshold 0\.95/.test(d.message));
  assert.throws(() => migrationGate(meta(true), { minKlRecovered: NaN }), RangeError);
});
