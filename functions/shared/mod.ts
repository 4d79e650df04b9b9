// Face of functions/shared, the HTTP glue every function app uses: the base app (probes, auth,
// one onError), the mapping of domain errors to HTTP, request bodies, request schemas, SSE and
// process serving. The serving core itself is lib/serve. Test helpers are test_helpers.ts.

export { clientSignal, createBaseApp, jsonBodyLimit, keyMatches, peerHeaders } from "./app.ts";
export { isSnapshotBody, requestBody, SNAPSHOT_TYPE } from "./body.ts";
export {
  blameSnapshot,
  errorHandler,
  errorResponse,
  type ErrorStatus,
  HttpError,
  readJsonBody,
  toHttpError,
} from "./errors.ts";
export { generationOptions, messagesSchema, samplingFields, tokenIdsSchema } from "./schemas.ts";
export { type Register, serveFunctions } from "./serve.ts";
export { sseResponse } from "./sse.ts";
