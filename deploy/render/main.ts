// `deno task deploy render [--platform knative|cloudrun|modal|runpod] [--tier NAME] [--check]`:
// writes the rendered deployment files under deploy/ (or, with --check, lists the stale ones and
// exits 1). Usage errors exit 2; an invalid config exits 2 listing its problems.
import "./no_deprecation_warnings.ts";
import { parseArgs } from "node:util";
import { ConfigError } from "../../lib/config/mod.ts";
import { type Platform, PLATFORMS, renderDeployments, strayFiles } from "./render.ts";
import { RenderError } from "./spec.ts";

const root = new URL("../../", import.meta.url).pathname;
const usage = "usage: deno task deploy render [--platform knative|cloudrun|modal|runpod]... " +
  "[--tier NAME]... [--check]";

let parsed;
try {
  parsed = parseArgs({
    args: Deno.args,
    allowPositionals: true,
    options: {
      platform: { type: "string", multiple: true, default: [] },
      tier: { type: "string", multiple: true, default: [] },
      check: { type: "boolean", default: false },
      help: { type: "boolean", default: false },
    },
  });
} catch (e) {
  const msg = (e as Error).message.split("\n")[0].replace(/\. To specify.*/, "");
  console.error(`deploy: ${msg}\n${usage}`);
  Deno.exit(2);
}
const args = { ...parsed.values, _: parsed.positionals };
if (args.help) {
  console.log(usage);
  Deno.exit(0);
}
if (args._.length !== 1 || args._[0] !== "render") {
  console.error(
    `deploy: ${
      args._.length === 0 ? "no command" : `unknown command "${args._.join(" ")}"`
    }\n${usage}`,
  );
  Deno.exit(2);
}
const platforms = args.platform as string[];
for (const p of platforms) {
  if (!(PLATFORMS as readonly string[]).includes(p)) {
    console.error(`--platform: unknown platform "${p}" (one of ${PLATFORMS.join(", ")})`);
    Deno.exit(2);
  }
}
let files: Map<string, string>;
try {
  files = await renderDeployments(root, {
    platforms: platforms.length ? platforms as Platform[] : undefined,
    tiers: (args.tier as string[]).length ? args.tier as string[] : undefined,
  });
} catch (e) {
  if (e instanceof ConfigError || e instanceof RenderError) {
    console.error(`deploy render: ${e.message}`);
    Deno.exit(2);
  }
  throw e;
}
const stale: string[] = [];
for (const [path, text] of files) {
  let old: string | null = null;
  try {
    old = await Deno.readTextFile(`${root}${path}`);
  } catch (e) {
    if (!(e instanceof Deno.errors.NotFound)) throw e;
  }
  if (old === text) continue;
  stale.push(path);
  if (!args.check) {
    await Deno.mkdir(`${root}${path.slice(0, path.lastIndexOf("/"))}`, { recursive: true });
    await Deno.writeTextFile(`${root}${path}`, text);
  }
}
const unfiltered = platforms.length === 0 && (args.tier as string[]).length === 0;
const stray = unfiltered ? await strayFiles(root, files) : [];
if (args.check) {
  for (const p of [...stale, ...stray]) console.log(`stale: ${p}`);
  const bad = stale.length + stray.length;
  console.log(
    bad === 0
      ? `deploy render --check: ${files.size} files up to date`
      : `deploy render --check: ${bad} of ${files.size + stray.length} files stale ` +
        "(deno task deploy render writes them)",
  );
  Deno.exit(bad ? 1 : 0);
}
for (const p of stale) console.log(`wrote ${p}`);
for (const p of stray) console.log(`not rendered by any config (remove it): ${p}`);
console.log(`${files.size} files rendered, ${stale.length} changed`);
