// Real-model checks on the bundled demo pair and the committed projectors (models/projectors/):
// migrated + repair is closer to full prefill than no prefix (kl_recovered > 0.5) with a measured
// top-1 agreement, for the linear projector and for the ONNX (learned MLP) one; a projector is
// refused for the wrong pair. Few windows of valid.txt to keep the runtime small.

import { readValidSample } from "../../tests/support/corpus.ts";
import assert from "node:assert/strict";
import { loadModel } from "../engine/mod.ts";
import { MigrationRefusedError } from "./errors.ts";
import { evaluateMigration } from "./evaluate.ts";
import { endpointOf, migrateAndRepair } from "./migrate.ts";
import { discoverProjectors, findProjector, loadProjector } from "./projector.ts";
import { argmaxOf } from "./temperature.ts";

const root = new URL("../../", import.meta.url).pathname;

async function pair() {
  const fast = await loadModel(`${root}models/tiny-fast`, { threads: 2 });
  const powerful = await loadModel(`${root}models/tiny-powerful`, { threads: 2 });
  const text = (await readValidSample()).slice(0, 40000);
  return { fast, powerful, ids: fast.tokenizer.encode(text) };
}

for (const kind of ["tiny-fast--tiny-powerful", "tiny-fast--tiny-powerful-mlp"]) {
  Deno.test(`evaluateMigration() on the demo pair with ${kind}: kl_recovered > 0.5 and top-1 agreement measured at repair 8`, async () => {
    const { fast, powerful, ids } = await pair();
    const proj = await loadProjector(
      `${root}models/projectors/${kind}`,
      endpointOf(fast),
      endpointOf(powerful),
    );
    try {
      const ev = await evaluateMigration(fast, powerful, proj, ids, {
        prefix: 192,
        continuation: 64,
        repairs: [8],
        maxWindows: 3,
      });
      const m = ev.repair["8"];
      console.log(
        `  ${kind} (${proj.meta.kind}), ${ev.windows} windows: kl_recovered ${
          m.kl_recovered.toFixed(3)
        }, recovered ${m.recovered.toFixed(3)}, ` +
          `top1 ${m.top1_agreement.toFixed(3)} (no prefix ${
            ev.no_prefix_top1_agreement.toFixed(3)
          }), ttft ${m.ttft_ms.toFixed(1)} vs full ${ev.full_ttft_ms.toFixed(1)} ms`,
      );
      assert.ok(m.kl_recovered > 0.5, `kl_recovered ${m.kl_recovered}`);
      assert.ok(
        m.top1_agreement > ev.no_prefix_top1_agreement,
        "migrated agrees with full more often than no prefix",
      );
      // the repair decode path: the first token from migrate+repair equals full prefill's here
      const prompt = ids.slice(0, 100);
      using src = fast.native.createSequence(128);
      await src.prefill(prompt);
      using dst = powerful.native.createSequence(128);
      const r = await migrateAndRepair({
        source: endpointOf(fast),
        sourceSeq: src,
        target: endpointOf(powerful),
        targetSeq: dst,
        projector: proj,
        prompt,
        repair: 8,
      });
      assert.equal(r.mode, "project");
      assert.equal(r.migratedTokens + r.repairTokens, 100);
      using full = powerful.native.createSequence(128);
      const fullLogits = await full.prefill(prompt);
      assert.equal(
        argmaxOf(r.logits),
        argmaxOf(fullLogits),
        "migrate+repair's first token differs from the full prefill's",
      );
      const next = await dst.decode(argmaxOf(r.logits));
      assert.equal(next.length, powerful.native.config.vocabSize);
    } finally {
      await proj.free();
      fast.native.free();
      powerful.native.free();
    }
  });
}

Deno.test("loadProjector() refuses a demo projector for the wrong pair with a typed reason", async () => {
  const fast = await loadModel(`${root}models/tiny-fast`, { threads: 1 });
  const balanced = await loadModel(`${root}models/tiny-balanced`, { threads: 1 });
  try {
    await assert.rejects(
      loadProjector(
        `${root}models/projectors/tiny-fast--tiny-powerful`,
        endpointOf(fast),
        endpointOf(balanced),
      ),
      (e: unknown) => e instanceof MigrationRefusedError && e.reason === "target_mismatch",
    );
    await assert.rejects(
      loadProjector(
        `${root}models/projectors/tiny-fast--tiny-powerful`,
        endpointOf(balanced),
        endpointOf(fast),
      ),
      (e: unknown) => e instanceof MigrationRefusedError && e.reason === "source_mismatch",
    );
  } finally {
    fast.native.free();
    balanced.native.free();
  }
});

Deno.test("discoverProjectors() lists the committed projectors and findProjector() picks one per pair", async () => {
  const { projectors, errors } = await discoverProjectors(`${root}models/projectors`);
  assert.deepEqual(errors, []);
  const names = projectors.map((p) => p.dir.split("/").pop());
  for (
    const n of [
      "tiny-balanced--tiny-powerful",
      "tiny-fast--tiny-balanced",
      "tiny-fast--tiny-powerful",
    ]
  ) {
    assert.ok(names.includes(n), `${n} in ${names}`);
  }
  for (const p of projectors) {
    assert.ok(p.meta.quality !== null, `${p.dir} has measured quality`);
    assert.equal(
      p.dir.split("/").pop()?.startsWith(`${p.meta.source.name}--${p.meta.target.name}`),
      true,
    );
  }
  const fast = await loadModel(`${root}models/tiny-fast`, { threads: 1 });
  const balanced = await loadModel(`${root}models/tiny-balanced`, { threads: 1 });
  try {
    const hit = findProjector(projectors, endpointOf(fast), endpointOf(balanced));
    assert.equal(hit?.dir.split("/").pop(), "tiny-fast--tiny-balanced");
    assert.equal(findProjector(projectors, endpointOf(balanced), endpointOf(fast)), null);
  } finally {
    fast.native.free();
    balanced.native.free();
  }
});
