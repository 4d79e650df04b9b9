// Runs the GPU check's driver (gpu_check.py) for its tests: arguments, extra environment and an
// output folder of its own; returns the exit status, stdout + stderr and gpu_check.json (null when
// none was written).

export const root = new URL("../../", import.meta.url).pathname;
export const lib = Deno.env.get("KVRELAY_LIB") ?? `${root}build/native/libkvrelay.so`;
export const driver = `${root}scripts/gpu_check/gpu_check.py`;

export interface Check {
  section: string;
  name: string;
  ok: boolean;
  detail: string;
}

export interface DriverReport {
  failed: number;
  passed: number;
  running: string | null;
  terminated: boolean;
  info: Record<string, unknown>;
  checks: Check[];
  skipped: { section: string; name: string; why: string }[];
  bench: Record<string, unknown>[];
}

export async function readReport(out: string): Promise<DriverReport | null> {
  try {
    return JSON.parse(await Deno.readTextFile(`${out}/gpu_check.json`));
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return null;
    throw e;
  }
}

export async function runDriver(
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number; text: string; report: DriverReport | null }> {
  const out = await Deno.makeTempDir({ prefix: "gpu_check_" });
  try {
    const { code, stdout, stderr } = await new Deno.Command("python3", {
      args: [driver, "--lib", lib, "--out", out, ...args],
      env: { OMP_WAIT_POLICY: "passive", ...env },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr);
    return { code, text, report: await readReport(out) };
  } finally {
    await Deno.remove(out, { recursive: true });
  }
}
