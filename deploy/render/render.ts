// Renders every deployment file under deploy/ from the deploy configs (deploy/configs/<name>.json;
// <name>.cuda.json is itself rendered: the same config with every tier on `backend: cuda`). Pure
// apart from reading the configs: returns path → text, and main.ts writes or checks them.
import { stringify } from "yaml";
import { cloudRunService } from "./cloudrun.ts";
import { knativeService } from "./knative.ts";
import { renderModal } from "./modal.ts";
import { runpodDeployment } from "./runpod.ts";
import {
  cudaConfigJson,
  type DeploymentSpec,
  deploymentSpec,
  renderedHeader,
  RenderError,
  type Variant,
} from "./spec.ts";

/** Platforms `deno task deploy render --platform` accepts. */
export const PLATFORMS = ["knative", "cloudrun", "modal", "runpod"] as const;
/** One platform. */
export type Platform = typeof PLATFORMS[number];

/** Options of {@link renderDeployments}. */
export interface RenderOptions {
  /** Only these platforms (default all). */
  platforms?: readonly Platform[];
  /** Only the deploy configs with these names (file name without .json; default all). */
  tiers?: readonly string[];
}

const yamlDoc = (spec: DeploymentSpec, what: string, obj: { toJSON(): unknown }) =>
  renderedHeader(spec, what) + stringify(obj.toJSON(), { lineWidth: 0 });

function platformFiles(spec: DeploymentSpec, name: string, platform: Platform): [string, string] {
  const gpu = spec.variant === "cuda";
  const what = `${spec.deploy.function} function, tier ${spec.deploy.tier}, ${
    gpu ? "GPU" : "CPU"
  } image.`;
  switch (platform) {
    case "knative":
      return [
        `deploy/knative/${name}${gpu ? "-cuda" : ""}.yaml`,
        yamlDoc(
          spec,
          `Knative Service: ${what} kubectl apply -f <this file>`,
          knativeService(spec),
        ),
      ];
    case "cloudrun":
      return [
        `deploy/cloudrun/${name}${gpu ? "-l4" : ""}.yaml`,
        yamlDoc(
          spec,
          `Cloud Run service: ${what} gcloud run services replace <this file> --region REGION`,
          cloudRunService(spec),
        ),
      ];
    case "modal":
      return [`deploy/modal/${spec.name.replaceAll("-", "_")}.py`, renderModal(spec)];
    case "runpod":
      return [
        `deploy/runpod/${name}${gpu ? "-cuda" : ""}.json`,
        JSON.stringify(runpodDeployment(spec), null, 2) + "\n",
      ];
  }
}

/**
 * Renders the files of every selected deployment and platform.
 * @param root repository root (absolute, ending in "/")
 * @param opts platform and tier filters
 * @returns repository-relative path → file text, sorted by path
 * @throws {ConfigError} for an invalid deploy config; {RenderError} for a value a platform
 *   cannot take (names the config field); Error when a filter matches nothing
 */
export async function renderDeployments(
  root: string,
  opts: RenderOptions = {},
): Promise<Map<string, string>> {
  const platforms = opts.platforms ?? PLATFORMS;
  const names: string[] = [];
  for await (const e of Deno.readDir(`${root}deploy/configs`)) {
    if (e.isFile && e.name.endsWith(".json") && !e.name.endsWith(".cuda.json")) {
      names.push(e.name.slice(0, -".json".length));
    }
  }
  names.sort();
  const unknown = (opts.tiers ?? []).filter((t) => !names.includes(t));
  if (unknown.length > 0) {
    throw new RenderError(
      "deploy/configs",
      "--tier",
      `no deploy config for ${unknown.map((t) => `"${t}"`).join(", ")} (have: ${names.join(", ")})`,
    );
  }
  const selected = opts.tiers ? names.filter((n) => opts.tiers!.includes(n)) : names;
  const out = new Map<string, string>();
  for (const name of selected) {
    const path = `deploy/configs/${name}.json`;
    const json = JSON.parse(await Deno.readTextFile(`${root}${path}`));
    const cudaPath = `deploy/configs/${name}.cuda.json`;
    const cudaJson = cudaConfigJson(json);
    out.set(cudaPath, JSON.stringify(cudaJson, null, 2) + "\n");
    const variants: [Variant, string, unknown][] = [["cpu", path, json], [
      "cuda",
      cudaPath,
      cudaJson,
    ]];
    for (const [variant, p, j] of variants) {
      const spec = deploymentSpec(p, j, variant);
      for (const platform of platforms) {
        const [file, text] = platformFiles(spec, name, platform);
        out.set(file, text);
      }
    }
  }
  return new Map([...out.entries()].sort(([a], [b]) => a.localeCompare(b)));
}

/**
 * Files under the rendered folders that the renderer would not write (left from a removed
 * config or tier): the stale check reports them too.
 * @param root repository root
 * @param rendered the full render (no filters)
 * @returns repository-relative paths
 */
export async function strayFiles(root: string, rendered: Map<string, string>): Promise<string[]> {
  const stray: string[] = [];
  for (const dir of ["knative", "cloudrun", "modal", "runpod"]) {
    try {
      for await (const e of Deno.readDir(`${root}deploy/${dir}`)) {
        const p = `deploy/${dir}/${e.name}`;
        if (e.isFile && !rendered.has(p)) stray.push(p);
      }
    } catch (e) {
      if (!(e instanceof Deno.errors.NotFound)) throw e;
    }
  }
  for await (const e of Deno.readDir(`${root}deploy/configs`)) {
    const p = `deploy/configs/${e.name}`;
    if (e.name.endsWith(".cuda.json") && !rendered.has(p)) stray.push(p);
  }
  return stray.sort();
}
