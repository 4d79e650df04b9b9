// Tests for backend probing and selection: kvr_backend_probe answers for the CPU (a description
// naming this machine's CPU model) and for CUDA (a clean reason in a build or on a machine
// without it), "auto" falling back to the CPU with that reason, and models reporting the backend
// they run on. Needs the built library.

import assert from "node:assert/strict";
import {
  autoFallbackWords,
  BackendUnavailableError,
  noteAutoFallback,
  probeBackend,
  resolveBackend,
} from "./backend.ts";
import { EngineError } from "./errors.ts";
import { cpuKernelName } from "./gemm.ts";
import { openNativeLibrary } from "./library.ts";
import { NativeModel } from "./model.ts";
import { checkpoint, DEMO_DIRS } from "./test_helpers.ts";

// A CUDA-less build answers with the stub's message; a CUDA build on a machine without a usable
// GPU with "no CUDA device: <reason>" (backend.h, cuda_probe).
const NO_CUDA =
  /^(built without CUDA support \(nvcc not found at build time\)|no CUDA device: .+)$/;

/** The first "model name" of /proc/cpuinfo: the oracle for the CPU description. */
async function cpuModelName(): Promise<string> {
  const text = await Deno.readTextFile("/proc/cpuinfo");
  const line = text.split("\n").find((l) => l.startsWith("model name"));
  return line ? line.slice(line.indexOf(":") + 1).trim() : "unknown CPU";
}

Deno.test("`probeBackend()` answers OK for the CPU with its model name, cores and kernels", async () => {
  const p = probeBackend("cpu");
  assert.equal(p.ok, true);
  assert.equal(p.status, "OK");
  const name = await cpuModelName();
  assert.ok(p.info.startsWith(`cpu: ${name}, `), p.info);
  assert.match(
    p.info,
    /, [1-9]\d* cores, (avx2-fma-f16c|generic) kernels \(gemm [a-z0-9-]+(, few-row bf16 amx)?, int8 [a-z0-9-]+, q8 [a-z0-9-]+, q4 [a-z0-9-]+\)$/,
  );
  assert.ok(p.info.includes(`(gemm ${cpuKernelName()}, `), p.info);
  // AMX is named exactly when /proc/cpuinfo lists it (the probe describes the auto kernels).
  const flags = (await Deno.readTextFile("/proc/cpuinfo").catch(() => "")).match(/^flags\s*:(.*)$/m)
    ?.[1].split(/\s+/) ?? [];
  const amx = ["amx_bf16", "amx_tile", "avx512f", "avx512bw", "avx512_vnni"].every((f) =>
    flags.includes(f)
  );
  assert.equal(p.info.includes(", few-row bf16 amx, "), amx, p.info);
});

Deno.test("`probeBackend()` answers CUDA with a clean UNSUPPORTED reason where there is no GPU", () => {
  // This machine has no NVIDIA driver, whatever the build.
  const p = probeBackend("cuda", 0);
  assert.equal(p.ok, false);
  assert.equal(p.status, "UNSUPPORTED");
  assert.match(p.info, NO_CUDA);
  assert.equal(openNativeLibrary().lastError(), p.info);
});

Deno.test("`kvr_backend_probe` refuses a bad backend or device and truncates info to its buffer", () => {
  const lib = openNativeLibrary();
  const buf = new Uint8Array(64);
  assert.equal(lib.symbols.kvr_backend_probe(7, 0, buf, 64n), -1);
  assert.match(new TextDecoder().decode(buf.subarray(0, buf.indexOf(0))), /backend 7 is not/);
  assert.equal(lib.symbols.kvr_backend_probe(0, 1, buf, 64n), -1);
  assert.match(lib.lastError(), /cpu backend has only device 0/);
  assert.equal(lib.symbols.kvr_backend_probe(1, -1, buf, 64n), -1);
  const small = new Uint8Array(8).fill(0xff);
  assert.equal(lib.symbols.kvr_backend_probe(0, 0, small, 8n), 0);
  assert.equal(
    new TextDecoder().decode(small.subarray(0, 7)),
    probeBackend("cpu").info.slice(0, 7),
  );
  assert.equal(small[7], 0);
  assert.equal(lib.symbols.kvr_backend_probe(0, 0, null, 0n), 0);
  assert.throws(() => probeBackend("cpu", -1), RangeError);
  assert.throws(() => probeBackend("tpu" as "cpu"), TypeError);
});

Deno.test("`resolveBackend()` turns auto into the CPU with the CUDA probe's reason, and refuses cuda", () => {
  const auto = resolveBackend("auto");
  assert.equal(auto.backend, "cpu");
  assert.equal(auto.device, 0);
  assert.equal(auto.info, probeBackend("cpu").info);
  assert.equal(auto.fallbackReason, probeBackend("cuda").info);
  assert.match(auto.fallbackReason!, NO_CUDA);
  const cpu = resolveBackend("cpu", 3); // the CPU ignores the device
  assert.deepEqual(cpu, { backend: "cpu", device: 0, info: auto.info });
  assert.throws(() => resolveBackend("cuda", 0), (e: unknown) => {
    assert.ok(e instanceof BackendUnavailableError);
    assert.equal(e.probe.status, "UNSUPPORTED");
    assert.match(e.message, /^backend cuda \(device 0\) is unavailable: /);
    assert.ok(e.message.endsWith(e.probe.info));
    return true;
  });
});

Deno.test("`NativeModel` reports the backend and device it runs on", async () => {
  using m = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  assert.equal(m.backend, "cpu");
  assert.equal(m.device, 0);
  assert.equal(m.deviceInfo, `${probeBackend("cpu").info}, 1 threads`);
});

Deno.test("`NativeModel.load()` with backend cuda fails with the probe's reason where there is no GPU", async () => {
  const ckpt = await checkpoint(DEMO_DIRS[0]);
  assert.throws(() => NativeModel.load(ckpt, { backend: "cuda", threads: 1 }), (e: unknown) => {
    assert.ok(e instanceof EngineError);
    assert.equal(e.codeName, "UNSUPPORTED");
    assert.match(e.message, /^kvr_model_load failed \(UNSUPPORTED, -5\): /);
    assert.match(e.message.slice(e.message.indexOf("): ") + 3), NO_CUDA);
    return true;
  });
  assert.throws(
    () => NativeModel.load(ckpt, { backend: "cpu", device: 1 }),
    /INVALID_ARGUMENT.*cpu backend has only device 0/,
  );
  assert.throws(() => NativeModel.load(ckpt, { backend: "tpu" as "cpu" }), TypeError);
});

Deno.test("`NativeModel.load()` with backend auto runs on the CPU here and logs the reason once per process", async () => {
  const ckpt = await checkpoint(DEMO_DIRS[0]);
  const logged: string[] = [];
  const original = console.error;
  console.error = (...a: unknown[]) => logged.push(a.join(" "));
  try {
    using a = NativeModel.load(ckpt, { backend: "auto", threads: 1 });
    using b = NativeModel.load(ckpt, { backend: "auto", threads: 1 });
    assert.equal(a.backend, "cpu");
    assert.equal(b.deviceInfo, a.deviceInfo);
  } finally {
    console.error = original;
  }
  // Another test file in this process may have logged first; at most one line, and its text.
  assert.ok(logged.length <= 1, logged.join("\n"));
  for (const l of logged) {
    assert.equal(
      l,
      `kvrelay: backend auto → cpu (${autoFallbackWords(probeBackend("cuda").info)})`,
    );
  }
  assert.equal(noteAutoFallback("again"), false);
});

Deno.test("`NativeModel.health()` is null for a CPU model and throws once the model is freed", async () => {
  const model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  assert.equal(model.health(), null);
  model.free();
  assert.throws(() => model.health(), /has been freed/);
});

Deno.test("`autoFallbackWords()` words plain CUDA absence as information and keeps other reasons", () => {
  assert.equal(
    autoFallbackWords("built without CUDA support (nvcc not found at build time)"),
    "library built without CUDA",
  );
  for (
    const r of ["cudaErrorInsufficientDriver (35): driver too old", "cudaErrorNoDevice (100): none"]
  ) {
    assert.equal(autoFallbackWords(`no CUDA device: ${r}`), "no CUDA device");
  }
  assert.equal(
    autoFallbackWords("no CUDA device: cudaErrorECCUncorrectable (214): ECC"),
    "CUDA unavailable: no CUDA device: cudaErrorECCUncorrectable (214): ECC",
  );
  // What this machine's probe says is one of the plain-absence forms.
  assert.doesNotMatch(autoFallbackWords(probeBackend("cuda").info), /cudaError|unavailable/);
});
