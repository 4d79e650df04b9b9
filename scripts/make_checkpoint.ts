// `deno task checkpoint <shape...> [--out DIR] [--seed N] [--force]`: writes random-weight BF16
// Hugging Face checkpoints with real model shapes (qwen3-0.6b, llama-3.2-1b) under
// build/checkpoints/<shape>/ (gitignored; never committed). An existing complete checkpoint with
// the same config is kept unless --force. Generator: tests/fixtures/real_shapes.ts.

import { parseArgs } from "node:util";
import { REAL_SHAPES, shapeSize, writeShapeCheckpoint } from "../tests/fixtures/real_shapes.ts";

const root = new URL("../", import.meta.url).pathname;

/** Default directory of a named shape's checkpoint. */
export function checkpointDir(shape: string): string {
  return `${root}build/checkpoints/${shape}`;
}

/**
 * Returns the directory of a named shape's checkpoint, writing it first when it is missing,
 * incomplete or has another config (or when `force`).
 * @param shape a key of REAL_SHAPES
 * @param opts out directory (default build/checkpoints/<shape>), seed, force, log
 * @returns the checkpoint directory
 * @throws RangeError for an unknown shape
 */
export async function ensureShapeCheckpoint(
  shape: string,
  opts: { out?: string; seed?: number; force?: boolean; log?: (line: string) => void } = {},
): Promise<string> {
  const cfg = REAL_SHAPES[shape];
  if (!cfg) {
    throw new RangeError(
      `unknown shape "${shape}"; shapes: ${Object.keys(REAL_SHAPES).join(", ")}`,
    );
  }
  const dir = opts.out ?? checkpointDir(shape);
  const want = JSON.stringify(cfg, null, 2) + "\n";
  const have = await Deno.readTextFile(`${dir}/config.json`).catch(() => null);
  const complete = await Deno.stat(`${dir}/model.safetensors`).then(() => true, () => false);
  if (!opts.force && have === want && complete) return dir;
  const { params, bytes } = shapeSize(cfg);
  opts.log?.(
    `writing ${shape}: ${(params / 1e6).toFixed(0)}M params, ${
      (bytes / 2 ** 30).toFixed(2)
    } GiB bf16 → ${dir}`,
  );
  const t0 = performance.now();
  await writeShapeCheckpoint(dir, cfg, opts.seed ?? 1);
  opts.log?.(`wrote ${shape} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  return dir;
}

if (import.meta.main) {
  const { values: args, positionals: names } = parseArgs({
    args: Deno.args,
    allowPositionals: true,
    options: {
      out: { type: "string" },
      seed: { type: "string" },
      force: { type: "boolean" },
      help: { type: "boolean" },
    },
  });
  if (args.help || names.length === 0) {
    console.log(
      `usage: deno task checkpoint <shape...> [--out DIR] [--seed N] [--force]\nshapes: ${
        Object.keys(REAL_SHAPES).join(", ")
      } (or "all"); default DIR build/checkpoints/<shape>`,
    );
    Deno.exit(args.help ? 0 : 2);
  }
  const shapes = names.includes("all") ? Object.keys(REAL_SHAPES) : names;
  if (args.out !== undefined && shapes.length > 1) {
    console.error("--out takes one shape");
    Deno.exit(2);
  }
  const seed = args.seed === undefined ? 1 : Number(args.seed);
  if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) {
    console.error(`--seed must be an integer in [0, 2^32), got "${args.seed}"`);
    Deno.exit(2);
  }
  for (const shape of shapes) {
    if (!(shape in REAL_SHAPES)) {
      console.error(`unknown shape "${shape}"; shapes: ${Object.keys(REAL_SHAPES).join(", ")}`);
      Deno.exit(2);
    }
  }
  for (const shape of shapes) {
    const dir = await ensureShapeCheckpoint(shape, {
      out: args.out,
      seed,
      force: args.force,
      log: console.log,
    });
    console.log(dir);
  }
}
