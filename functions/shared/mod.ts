// Face of functions/shared, the HTTP glue every function app uses: the base app (probes, auth,
// one onError), the mapping of domain errors to HTTP, request bodies, request schemas, SSE and
// process serving. The serving core itself is lib/serve. Test helpers are test_helpers.ts.

export {
  clientSignal,
  createBaseApp,
  keyIndex,
  keyMatches,
  MAX_HEADER_BYTES,
  peerHeaders,
} from "./app.ts";
export {
  illFormedPath,
  isJsonBody,
  isSnapshotBody,
  jsonDepth,
  MAX_JSON_DEPTH,
  readJson,
  requestBody,
  SNAPSHOT_TYPE,
  snapshotOrJson,
  strictQuery,
} from "./body.ts";
export { keyTenant, requestContext } from "./context.ts";
export { deadlineTier, responseDeadline } from "./response_deadline.ts";
export {
  blameSnapshot,
  errorBody,
  errorHandler,
  errorResponse,
  type ErrorStatus,
  HttpError,
  toHttpError,
} from "./errors.ts";
export { generationOptions, messagesSchema, samplingFields, tokenIdsSchema } from "./schemas.ts";
export { type Register, serveFunctions } from "./serve.ts";
export { sseResponse } from "./sse.ts";
