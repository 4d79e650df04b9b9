// The one CPU-feature dispatch of the library: which instruction sets this process may use
// (detected once, thread-safe static), the kernel selection that narrows them, and the one-line CPU
// description kvr_backend_probe and the CPU backend report. Every kernel choice (GEMM table,
// q8/q4 and int8 kernels, AMX, attention/norm/convert AVX2 paths, CRC32C) reads these predicates
// at each call — none caches its answer — so changing the selection re-selects all of them.
// Not the kernels themselves.
#pragma once

#include <cstdint>
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
};

// Detected once per process. A build with -DKVR_FORCE_GENERIC reports no AVX2/FMA/F16C (tests
// the portable paths of the vectorised engine kernels).
const CpuFeatures& cpu_features();

// The kernel selection: how far the GEMM and q8/q4/int8 kernel choices are narrowed below what the
// CPU has, so one machine runs every path it has. kBest: no narrowing; kAvx512 ("avx512"): AMX
// off (an AVX-512 machine without AMX, e.g. AMD Zen 4); kAvxVnni ("avxvnni"): AVX-512 off (AVX2 +
// AVX-VNNI, Alder Lake-like); kAvx2 ("avx2"): AVX-512 and AVX-VNNI off (an AVX2-only machine);
// kGeneric ("generic"): the portable kernels. The engine kernels (attention, norms, conversions)
// and CRC32C are not narrowed: the forced GEMM paths are checked to give the default path's logits
// bit for bit, with the same engine kernels underneath.
enum class KernelSelection : uint8_t { kBest, kAvx512, kAvxVnni, kAvx2, kGeneric };

// The current selection (a relaxed atomic load). Initially from the environment variable
// KVRELAY_CPU_KERNEL (generic|avx2|avxvnni|avx512; unset, empty or anything else: kBest), read at
// the first call.
KernelSelection kernel_selection();

// Changes the selection (the test library's kvr_test_set_cpu_kernel): nullptr or "" = kBest, else
// one of the names above. KVR_ERR_INVALID_ARGUMENT for an unknown name, KVR_ERR_UNSUPPORTED for a
// path this CPU cannot run (avx2 needs AVX2+FMA, avxvnni AVX-VNNI as well, avx512 AVX-512F), the
// reason recorded as kvr_last_error; the selection is then unchanged. Every choice made after it
// follows it. Not to be called while any other call of the library runs: one GEMM asks for its
// kernels more than once (its input packing and its tiles must agree).
int32_t set_kernel_selection(const char* name);

// Engine kernels (attention, norms, conversions): AVX2 + FMA + F16C together.
inline bool use_avx2_fma_f16c() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c;
}
// GEMM micro-kernels: AVX2 + FMA, unless the selection is generic.
inline bool use_avx2_gemm() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && kernel_selection() != KernelSelection::kGeneric;
}
// GEMM micro-kernels with AVX-512F zmm registers (same bits as AVX2), unless the selection is
// generic, avx2 or avxvnni.
inline bool use_avx512_gemm() {
  const KernelSelection s = kernel_selection();
  return cpu_features().avx512f && use_avx2_gemm() && s != KernelSelection::kAvx2 && s != KernelSelection::kAvxVnni;
}
// q8/q4 weight kernels with AVX-512 VNNI (F/BW/VL + vpdpbusd), unless the selection is generic,
// avx2 or avxvnni.
inline bool use_avx512_vnni() {
  const CpuFeatures& f = cpu_features();
  const KernelSelection s = kernel_selection();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && s != KernelSelection::kGeneric &&
         s != KernelSelection::kAvx2 && s != KernelSelection::kAvxVnni;
}
// q8/q4 weight kernels on ymm (AVX2 + FMA + F16C for the f16 scales of q4), unless the selection
// is generic.
inline bool use_avx2_quant() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c && kernel_selection() != KernelSelection::kGeneric;
}
// ... with AVX-VNNI's ymm vpdpbusd instead of vpmaddubsw/vpmaddwd, unless the selection is avx2.
inline bool use_avx_vnni() {
  return cpu_features().avxvnni && use_avx2_quant() && kernel_selection() != KernelSelection::kAvx2;
}
// The AMX bf16 few-row GEMM (gemm_amx.h), unless the selection narrows anything.
inline bool use_amx_bf16() {
  return cpu_features().amx_bf16 && use_avx512_vnni() && kernel_selection() != KernelSelection::kAvx512;
}
// CRC32C with the SSE4.2 crc32 instruction.
inline bool use_sse42_crc() { return cpu_features().sse42; }

// "cpu: <model name from /proc/cpuinfo>, <N> cores, <simd path> kernels".
std::string cpu_description();

}  // namespace kvr::cpu
