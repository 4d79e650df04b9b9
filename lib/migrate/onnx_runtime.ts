// The optional ONNX part: the one module that imports onnxruntime-node (~290 MB with its native
// binaries; the CPU provider ships in the npm tarball, its postinstall only fetches GPU providers).
// lib/migrate/onnx.ts loads it only when an `onnx` projector is opened. The images remove the
// package from deno.json/deno.lock unless built with KVRELAY_ONNX=1; this module then fails to load.
import * as ort from "onnxruntime-node";
import type { OrtModule } from "./onnx.ts";

export default ort satisfies OrtModule;
