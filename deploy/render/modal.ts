// Modal app for one deployment: a Python file (Modal deploys Python) running the same image and
// entry point as the other platforms as a `web_server`, with Modal's concurrency and scaling
// knobs from the config. Rendered from a typed object; the Python is only string formatting.
import { type DeploymentSpec, renderedHeader } from "./spec.ts";

/** Modal's GPU string for the CUDA variant (the library ships sm_80 code, which L4 runs). */
export const MODAL_GPU = "L4";

/** The values the Modal file carries (what the tests check). */
export interface ModalApp {
  appName: string;
  dockerfile: string;
  secret: string;
  cpu: number;
  memoryMib: number;
  gpu: string | null;
  minContainers: number;
  maxContainers: number;
  scaledownWindowS: number;
  timeoutS: number;
  targetInputs: number;
  maxInputs: number;
  port: number;
  command: string[];
  env: Record<string, string>;
}

/**
 * The Modal app's settings for a deployment.
 * @param spec the deployment
 * @returns the settings
 */
export function modalApp(spec: DeploymentSpec): ModalApp {
  return {
    appName: spec.name,
    dockerfile: spec.variant === "cuda" ? "deploy/Dockerfile.cuda" : "deploy/Dockerfile",
    secret: spec.deploy.secret,
    cpu: spec.cpu,
    memoryMib: spec.memoryMib,
    gpu: spec.gpus > 0 ? MODAL_GPU : null,
    minContainers: spec.deploy.min_scale,
    maxContainers: spec.deploy.max_scale,
    // Modal requires at least 2 s.
    scaledownWindowS: Math.max(2, spec.deploy.scale_down_delay_s),
    timeoutS: spec.requestTimeoutS,
    targetInputs: spec.targetConcurrency,
    maxInputs: spec.maxConcurrency,
    port: spec.port,
    command: ["deno", "run", "--cached-only", "-A", spec.entry],
    env: {
      KVRELAY_CONFIG: `/app/${spec.configPath}`,
      PORT: String(spec.port),
      HOST: "0.0.0.0",
    },
  };
}

const py = (v: unknown): string => {
  if (v === null) return "None";
  if (typeof v === "string") return JSON.stringify(v);
  if (typeof v === "number") {
    return Number.isInteger(v) ? String(v) : v.toFixed(3).replace(/0+$/, "");
  }
  if (Array.isArray(v)) return `[${v.map(py).join(", ")}]`;
  return `{${
    Object.entries(v as Record<string, unknown>).map(([k, x]) => `${py(k)}: ${py(x)}`).join(", ")
  }}`;
};

/**
 * Renders the Modal Python file.
 * @param spec the deployment
 * @returns file text
 */
export function renderModal(spec: DeploymentSpec): string {
  const m = modalApp(spec);
  const fn = spec.name.replaceAll("-", "_");
  return renderedHeader(
    spec,
    `Modal app: ${spec.deploy.function} function, tier ${spec.deploy.tier}.`,
  ) +
    `# Deploy from the repository root: modal deploy deploy/modal/${fn}.py
# Secrets: Modal secret ${py(m.secret)} holding ${spec.secretEnv.join(", ")}.
import os
import subprocess
from pathlib import Path

import modal

ROOT = Path(__file__).resolve().parents[2]
# Modal needs Python in the image; the image's ENTRYPOINT is replaced by the web server below.
image = modal.Image.from_dockerfile(
    str(ROOT / ${py(m.dockerfile)}), context_dir=str(ROOT), add_python="3.12"
).entrypoint([])
app = modal.App(${py(m.appName)})


@app.function(
    image=image,
    secrets=[modal.Secret.from_name(${py(m.secret)})],
    cpu=${py(m.cpu)},
    memory=${py(m.memoryMib)},
    gpu=${py(m.gpu)},
    min_containers=${py(m.minContainers)},
    max_containers=${py(m.maxContainers)},
    scaledown_window=${py(m.scaledownWindowS)},
    timeout=${py(m.timeoutS)},
)
@modal.concurrent(max_inputs=${py(m.maxInputs)}, target_inputs=${py(m.targetInputs)})
@modal.web_server(${py(m.port)}, startup_timeout=240)
def ${fn}() -> None:
    subprocess.Popen(
        ${py(m.command)},
        cwd="/app",
        env={**os.environ, **${py(m.env)}},
    )
`;
}
