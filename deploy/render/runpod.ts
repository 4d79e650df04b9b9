// RunPod for one deployment: the two REST bodies (POST https://rest.runpod.io/v1/templates, then
// POST /v1/endpoints with the returned templateId) in one JSON file. Checked against our zod
// transcription of RunPod's REST API (runpodSchema): RunPod publishes no validator library.
import { z } from "zod";
import type { DeploymentSpec } from "./spec.ts";

/** GPU types for the CUDA variant (sm_80 code runs on Ampere/Ada; sm_90a on Hopper). */
export const RUNPOD_GPUS = ["NVIDIA L4", "NVIDIA A100 80GB PCIe", "NVIDIA H100 80GB HBM3"];

/** The fields of RunPod's template and endpoint create bodies this renderer uses. */
export const runpodSchema = z.strictObject({
  _comment: z.string(),
  template: z.strictObject({
    name: z.string().min(1),
    imageName: z.string().min(1),
    category: z.enum(["CPU", "NVIDIA"]),
    isServerless: z.literal(true),
    containerDiskInGb: z.number().int().min(1),
    dockerStartCmd: z.array(z.string()).min(1),
    ports: z.array(z.string().regex(/^\d+\/(http|tcp)$/)),
    env: z.record(z.string().regex(/^[A-Z_][A-Z0-9_]*$/), z.string()),
    readme: z.string(),
  }),
  endpoint: z.strictObject({
    name: z.string().min(1),
    computeType: z.enum(["CPU", "GPU"]),
    gpuTypeIds: z.array(z.string()).min(1).optional(),
    gpuCount: z.number().int().min(1).optional(),
    vcpuCount: z.number().int().min(1).optional(),
    workersMin: z.number().int().min(0),
    workersMax: z.number().int().min(1),
    idleTimeout: z.number().int().min(1),
    scalerType: z.enum(["QUEUE_DELAY", "REQUEST_COUNT"]),
    scalerValue: z.number().int().min(1),
    executionTimeoutMs: z.number().int().min(1),
  }).refine((e) => (e.computeType === "GPU") === (e.gpuTypeIds !== undefined), {
    message: "gpuTypeIds is required for GPU endpoints and not allowed for CPU ones",
  }),
});

/** The RunPod file's content. */
export type RunpodDeployment = z.infer<typeof runpodSchema>;

/**
 * Renders the RunPod template + endpoint bodies. Secrets use RunPod secrets named after the env
 * variables (`{{ RUNPOD_SECRET_<NAME> }}`).
 * @param spec the deployment
 * @returns the validated bodies
 * @throws {ZodError} when a value breaks the transcribed API
 */
export function runpodDeployment(spec: DeploymentSpec): RunpodDeployment {
  const gpu = spec.gpus > 0;
  const env: Record<string, string> = {
    KVRELAY_CONFIG: `/app/${spec.configPath}`,
    PORT: String(spec.port),
    HOST: "0.0.0.0",
  };
  for (const name of spec.secretEnv) env[name] = `{{ RUNPOD_SECRET_${name} }}`;
  return runpodSchema.parse({
    _comment:
      `Rendered by \`deno task deploy render\` from ${spec.configPath} (${spec.variant} variant); ` +
      "do not edit. POST template to https://rest.runpod.io/v1/templates, then endpoint (plus the " +
      "returned templateId) to /v1/endpoints.",
    template: {
      name: spec.name,
      imageName: spec.image,
      category: gpu ? "NVIDIA" : "CPU",
      isServerless: true,
      containerDiskInGb: gpu ? 20 : 10,
      dockerStartCmd: [spec.entry],
      ports: [`${spec.port}/http`],
      env,
      readme: `kvrelay ${spec.deploy.function} function, tier ${spec.deploy.tier}. ` +
        "Liveness GET /healthz, readiness GET /readyz.",
    },
    endpoint: {
      name: spec.name,
      computeType: gpu ? "GPU" : "CPU",
      ...(gpu
        ? { gpuTypeIds: RUNPOD_GPUS, gpuCount: spec.gpus }
        : { vcpuCount: Math.ceil(spec.cpu) }),
      workersMin: spec.deploy.min_scale,
      workersMax: spec.deploy.max_scale,
      idleTimeout: Math.max(1, spec.deploy.scale_down_delay_s),
      scalerType: "REQUEST_COUNT",
      scalerValue: spec.targetConcurrency,
      executionTimeoutMs: spec.requestTimeoutS * 1000,
    },
  });
}
