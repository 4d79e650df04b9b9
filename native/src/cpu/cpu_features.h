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
  // The GEMM's generic kernel is forced by the environment KVRELAY_CPU_KERNEL=generic (read once);
  // KVRELAY_CPU_KERNEL=avx2 keeps the AVX-512 kernels off (to test the AVX2 path on any machine).
  bool gemm_forced_generic = false;
  bool gemm_forced_avx2 = false;
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
  return f.avx512f && use_avx2_gemm() && !f.gemm_forced_avx2;
}
// q8 weight kernels with AVX-512 VNNI (F/BW/VL + vpdpbusd), unless KVRELAY_CPU_KERNEL is
// generic or avx2.
inline bool use_avx512_vnni() {
  const CpuFeatures& f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && !f.gemm_forced_generic &&
         !f.gemm_forced_avx2;
}
// CRC32C with the SSE4.2 crc32 instruction.
inline bool use_sse42_crc() { return cpu_features().sse42; }

// "cpu: <model name from /proc/cpuinfo>, <N> cores, <simd path> kernels".
std::string cpu_description();

}  // namespace kvr::cpu
