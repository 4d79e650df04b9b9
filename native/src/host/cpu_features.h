// The one CPU-feature dispatch of the library: which instruction sets this process may use,
// detected once (thread-safe static), and the one-line CPU description kvr_backend_probe and the
// CPU backend report. Every kernel choice (GEMM table, attention/norm/convert AVX2 paths, CRC32C)
// reads these predicates. Not the kernels themselves.
#pragma once

#include <string>

namespace kvr::cpu {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, sse42 = false, avx512f = false;
  // AVX-512 BW/VL and VNNI (vpdpbusd): the q8 weight kernels (gemm_q8.cpp).
  bool avx512bw = false, avx512vl = false, avx512vnni = false;
  // AVX-VNNI (VEX-encoded vpdpbusd on ymm, CPUID 7.1 EAX bit 4): q8/q4 kernels without AVX-512.
  bool avxvnni = false;
  // AMX-TILE + AMX-BF16 with the kernel's permission to use the tile state (arch_prctl
  // ARCH_REQ_XCOMP_PERM, asked once at detection): the few-row bf16 GEMM (gemm_amx.h).
  bool amx_bf16 = false;
  // The environment KVRELAY_CPU_KERNEL (read once) narrows the choice so one machine tests every
  // path it has: `generic` forces the portable kernels; `avx2` keeps AVX-512 and AVX-VNNI off
  // (an AVX2-only machine); `avxvnni` keeps AVX-512 off (AVX2 + AVX-VNNI, Alder Lake-like);
  // `avx512` keeps AMX off (an AVX-512 machine without AMX, e.g. AMD Zen 4).
  bool gemm_forced_generic = false;
  bool gemm_forced_avx512 = false;
  bool gemm_forced_avx2 = false;
  bool gemm_forced_avxvnni = false;
};

// Detected once per process. A build with -DKVR_FORCE_GENERIC reports no AVX2/FMA/F16C (tests
// the portable paths of the vectorised engine kernels).
const CpuFeatures& cpu_features();

// Engine kernels (attention, norms, conversions): AVX2 + FMA + F16C together.
inline bool use_avx2_fma_f16c() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c;
}
// GEMM micro-kernels: AVX2 + FMA, unless KVRELAY_CPU_KERNEL=generic.
inline bool use_avx2_gemm() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && !f.gemm_forced_generic;
}
// GEMM micro-kernels with AVX-512F zmm registers (same bits as AVX2), unless KVRELAY_CPU_KERNEL
// is generic or avx2.
inline bool use_avx512_gemm() {
  const CpuFeatures& f = cpu_features();
  return f.avx512f && use_avx2_gemm() && !f.gemm_forced_avx2 && !f.gemm_forced_avxvnni;
}
// q8/q4 weight kernels with AVX-512 VNNI (F/BW/VL + vpdpbusd), unless KVRELAY_CPU_KERNEL is
// generic, avx2 or avxvnni.
inline bool use_avx512_vnni() {
  const CpuFeatures& f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && !f.gemm_forced_generic &&
         !f.gemm_forced_avx2 && !f.gemm_forced_avxvnni;
}
// q8/q4 weight kernels on ymm (AVX2 + FMA + F16C for the f16 scales of q4), unless
// KVRELAY_CPU_KERNEL=generic.
inline bool use_avx2_quant() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c && !f.gemm_forced_generic;
}
// ... with AVX-VNNI's ymm vpdpbusd instead of vpmaddubsw/vpmaddwd, unless KVRELAY_CPU_KERNEL=avx2.
inline bool use_avx_vnni() {
  const CpuFeatures& f = cpu_features();
  return f.avxvnni && use_avx2_quant() && !f.gemm_forced_avx2;
}
// The AMX bf16 few-row GEMM (gemm_amx.h), unless KVRELAY_CPU_KERNEL forces any narrower path.
inline bool use_amx_bf16() {
  const CpuFeatures& f = cpu_features();
  return f.amx_bf16 && use_avx512_vnni() && !f.gemm_forced_avx512;
}
// The sampler's exp over a vocabulary on zmm registers (host/sampling.cpp; the same bits as the
// scalar exp), unless KVRELAY_CPU_KERNEL forces a path without AVX-512.
inline bool use_avx512_exp() {
  const CpuFeatures& f = cpu_features();
  return f.avx512f && !f.gemm_forced_generic && !f.gemm_forced_avx2 && !f.gemm_forced_avxvnni;
}
// ... on ymm registers with AVX2 + FMA, unless KVRELAY_CPU_KERNEL=generic.
inline bool use_avx2_exp() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && !f.gemm_forced_generic;
}
// CRC32C with the SSE4.2 crc32 instruction.
inline bool use_sse42_crc() { return cpu_features().sse42; }

// "cpu: <model name from /proc/cpuinfo>, <N> cores, <simd path> kernels".
std::string cpu_description();

}  // namespace kvr::cpu
