// Cloud Run service (Knative serving API, `gcloud run services replace`) for one deployment: the
// CPU variant, or the GPU variant on one NVIDIA L4. Cloud Run's own limits are checked here
// (SIGTERM → SIGKILL after 10 s; an L4 needs ≥ 4 vCPU, ≥ 16 GiB, CPU always allocated); the
// object is validated against the Knative schema.
import { Service } from "@kubernetes-models/knative/serving.knative.dev/v1/Service";
import { container } from "./knative.ts";
import { CLOSE_SLACK_S, type DeploymentSpec, RenderError } from "./spec.ts";

/** Cloud Run sends SIGKILL this long after SIGTERM. */
export const CLOUD_RUN_SIGTERM_S = 10;
/** Cloud Run's only GPU type, and the minimum resources it requires. */
export const CLOUD_RUN_GPU = { accelerator: "nvidia-l4", minCpu: 4, minMemoryMib: 16384 };

/**
 * Renders the Cloud Run service. Secrets: Secret Manager secrets named after their env
 * variables (version `latest`).
 * @param spec the deployment
 * @returns the validated Service
 * @throws {RenderError} naming the config field that breaks a Cloud Run limit
 */
export function cloudRunService(spec: DeploymentSpec): Service {
  if (spec.drainS + CLOSE_SLACK_S > CLOUD_RUN_SIGTERM_S) {
    throw new RenderError(
      spec.configPath,
      "server.shutdown_grace_ms",
      `drain ${spec.drainS} s + ${CLOSE_SLACK_S} s close exceeds Cloud Run's ${CLOUD_RUN_SIGTERM_S} s SIGTERM grace`,
    );
  }
  const gpu = spec.gpus > 0;
  if (gpu && spec.cpu < CLOUD_RUN_GPU.minCpu) {
    throw new RenderError(
      spec.configPath,
      "deploy.gpu.cpu",
      `${spec.cpu} < ${CLOUD_RUN_GPU.minCpu} (L4 minimum)`,
    );
  }
  if (gpu && spec.memoryMib < CLOUD_RUN_GPU.minMemoryMib) {
    throw new RenderError(
      spec.configPath,
      "deploy.gpu.memory_mib",
      `${spec.memoryMib} < ${CLOUD_RUN_GPU.minMemoryMib} (L4 minimum)`,
    );
  }
  const annotations: Record<string, string> = {
    "autoscaling.knative.dev/minScale": String(spec.deploy.min_scale),
    "autoscaling.knative.dev/maxScale": String(spec.deploy.max_scale),
    // CPU stays allocated between requests: prefill/decode run on native threads and a GPU
    // service requires it.
    "run.googleapis.com/cpu-throttling": "false",
    "run.googleapis.com/startup-cpu-boost": "true",
  };
  const c = container(spec, (env) => ({ secretKeyRef: { name: env, key: "latest" } }));
  delete c.resources?.requests; // Cloud Run takes limits only
  const svc = new Service({
    metadata: {
      name: spec.name,
      labels: {
        "app.kubernetes.io/name": "kvrelay",
        "app.kubernetes.io/component": spec.deploy.function,
      },
    },
    spec: {
      template: {
        metadata: { annotations },
        spec: {
          // Cloud Run has no separate autoscaling target: it scales on this hard limit, so the
          // limit is the tier's running slots and excess requests wait at Cloud Run's frontend
          // for a new instance instead of in one instance's queue.
          containerConcurrency: spec.targetConcurrency,
          timeoutSeconds: spec.requestTimeoutS,
          ...(gpu
            ? { nodeSelector: { "run.googleapis.com/accelerator": CLOUD_RUN_GPU.accelerator } }
            : {}),
          containers: [{
            ...c,
            startupProbe: {
              httpGet: { path: "/readyz", port: spec.port },
              periodSeconds: 1,
              failureThreshold: 240,
              timeoutSeconds: 1,
            },
            livenessProbe: {
              httpGet: { path: "/healthz", port: spec.port },
              periodSeconds: 10,
              timeoutSeconds: 2,
              failureThreshold: 3,
            },
          }],
        },
      },
    },
  });
  svc.validate();
  return svc;
}
