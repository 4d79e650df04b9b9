// Local entry point (`deno task start`): every function (generate, prefill, migrate, decode) on
// one port over one runtime, configured by KVRELAY_CONFIG (default config/local.json).
import { registerDecode } from "./decode/app.ts";
import { registerGenerate } from "./generate/app.ts";
import { registerMigrate } from "./migrate/app.ts";
import { registerPrefill } from "./prefill/app.ts";
import { serveFunctions } from "./shared/mod.ts";

await serveFunctions("all", [registerGenerate, registerPrefill, registerMigrate, registerDecode]);
