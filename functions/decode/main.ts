// Serves the decode function alone (one deployable unit), configured by KVRELAY_CONFIG (default
// config/local.json), PORT and the secrets the config names.
import { registerDecode } from "./app.ts";
import { serveFunctions } from "../shared/mod.ts";

await serveFunctions("decode", [registerDecode]);
