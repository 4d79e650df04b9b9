// Knative Serving Service for one deployment (plain Knative: any cluster with Knative Serving;
// GPU variant requests `nvidia.com/gpu` through the NVIDIA device plugin). Built as a typed
// @kubernetes-models/knative Service and validated against its schema before it is written.
import { Service } from "@kubernetes-models/knative/serving.knative.dev/v1/Service";
import type { IContainer } from "kubernetes-models/v1/Container";
import type { IEnvVar } from "kubernetes-models/v1/EnvVar";
import {
  CLOSE_SLACK_S,
  cpuQuantity,
  type DeploymentSpec,
  memoryQuantity,
  RenderError,
} from "./spec.ts";

/** Env of the container: config path, host, and each secret env name from the platform secret. */
export function containerEnv(
  spec: DeploymentSpec,
  secretRef: (env: string) => IEnvVar["valueFrom"],
): IEnvVar[] {
  return [
    { name: "KVRELAY_CONFIG", value: `/app/${spec.configPath}` },
    { name: "HOST", value: "0.0.0.0" },
    ...spec.secretEnv.map((name) => ({ name, valueFrom: secretRef(name) })),
  ];
}

/**
 * The container (shared by Knative and Cloud Run): the image's entrypoint runs `args`.
 * @param spec the deployment
 * @param secretRef how a secret env variable is referenced on this platform
 * @returns the container
 */
export function container(
  spec: DeploymentSpec,
  secretRef: (env: string) => IEnvVar["valueFrom"],
): IContainer {
  const limits: Record<string, string> = {
    cpu: cpuQuantity(spec.cpu),
    memory: memoryQuantity(spec.memoryMib),
  };
  if (spec.gpus > 0) limits["nvidia.com/gpu"] = String(spec.gpus);
  return {
    name: "kvrelay",
    image: spec.image,
    args: [spec.entry],
    ports: [{ name: "http1", containerPort: spec.port }],
    env: containerEnv(spec, secretRef),
    resources: { requests: { ...limits }, limits },
  };
}

/**
 * Renders the Knative Service: concurrency autoscaling with the requests the tier runs at once
 * (`max_batch` when it batches, else `concurrency`) as target and that plus `queue_depth` as the
 * hard limit, min/max scale (0 = scale to zero), readiness on
 * /readyz, liveness on /healthz, request timeout = the tier's deadline. Knative sets the pod's
 * terminationGracePeriodSeconds to `timeoutSeconds` (the field itself is not allowed in a
 * Service), so the drain period must fit inside it.
 * @param spec the deployment
 * @returns the validated Service
 * @throws {RenderError} when the drain does not fit the termination grace; Error from the schema
 */
export function knativeService(spec: DeploymentSpec): Service {
  if (spec.drainS + CLOSE_SLACK_S > spec.requestTimeoutS) {
    throw new RenderError(
      spec.configPath,
      "server.shutdown_grace_ms",
      `drain ${spec.drainS} s + ${CLOSE_SLACK_S} s close does not fit Knative's termination grace ` +
        `(= timeoutSeconds ${spec.requestTimeoutS} s from tiers.${spec.deploy.tier}.request_timeout_ms)`,
    );
  }
  const c = container(spec, (env) => ({ secretKeyRef: { name: spec.deploy.secret, key: env } }));
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
        metadata: {
          annotations: {
            "autoscaling.knative.dev/class": "kpa.autoscaling.knative.dev",
            "autoscaling.knative.dev/metric": "concurrency",
            "autoscaling.knative.dev/target": String(spec.targetConcurrency),
            "autoscaling.knative.dev/min-scale": String(spec.deploy.min_scale),
            "autoscaling.knative.dev/max-scale": String(spec.deploy.max_scale),
            "autoscaling.knative.dev/scale-to-zero-pod-retention-period":
              `${spec.deploy.scale_down_delay_s}s`,
          },
        },
        spec: {
          containerConcurrency: spec.maxConcurrency,
          timeoutSeconds: spec.requestTimeoutS,
          containers: [{
            ...c,
            readinessProbe: {
              httpGet: { path: "/readyz", port: spec.port },
              periodSeconds: 1,
              failureThreshold: 3,
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
