// Machine facts recorded with every benchmark result, and the fp32 FMA peak the GEMM is compared
// to. The peak is a model, not a measurement: see fp32PeakGflops for the formula and its inputs.

/** What a benchmark ran on. */
export interface MachineInfo {
  cpuModel: string;
  logicalCpus: number;
  cpuMhz: number | null;
  simd: string[];
  os: string;
  deno: string;
  date: string;
}

/**
 * Reads CPU model, clock and SIMD flags from /proc/cpuinfo (Linux).
 * @returns Machine facts; fields are best-effort where /proc is absent.
 */
export async function machineInfo(): Promise<MachineInfo> {
  const cpuinfo = await Deno.readTextFile("/proc/cpuinfo").catch(() => "");
  const field = (name: string) => cpuinfo.match(new RegExp(`^${name}\\s*:\\s*(.*)$`, "m"))?.[1];
  const flags = new Set((field("flags") ?? "").split(/\s+/));
  return {
    cpuModel: field("model name") ?? "unknown",
    logicalCpus: navigator.hardwareConcurrency,
    cpuMhz: field("cpu MHz") ? Number(field("cpu MHz")) : null,
    simd: ["sse4_2", "avx", "avx2", "fma", "f16c", "avx512f"].filter((f) => flags.has(f)),
    os: `${Deno.build.os}-${Deno.build.arch}`,
    deno: Deno.version.deno,
    date: new Date().toISOString(),
  };
}

/**
 * fp32 FMA peak in GFLOP/s = threads × FMA pipes × fp32 lanes × 2 flops × GHz, with 2 pipes of
 * 256-bit (8 lanes) for AVX2+FMA cores (Zen 2/3/4, Haswell..Alder Lake P-cores), 1 pipe × 4
 * lanes otherwise. The clock is /proc/cpuinfo's "cpu MHz", which under a hypervisor is the nominal
 * clock: boost can exceed it, so the ratio can overstate efficiency slightly.
 * @param info Machine facts from machineInfo().
 * @param threads Cores the measured kernel used.
 * @returns Peak GFLOP/s, or null when the clock is unknown.
 */
export function fp32PeakGflops(info: MachineInfo, threads: number): number | null {
  if (info.cpuMhz === null) return null;
  const fmaAvx2 = info.simd.includes("avx2") && info.simd.includes("fma");
  const pipes = fmaAvx2 ? 2 : 1;
  const lanes = fmaAvx2 ? 8 : 4;
  return threads * pipes * lanes * 2 * (info.cpuMhz / 1000);
}

/**
 * Median of a non-empty list.
 * @param xs Samples.
 * @returns The median.
 * @throws RangeError on an empty list.
 */
export function median(xs: number[]): number {
  if (xs.length === 0) throw new RangeError("median of an empty list");
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}
