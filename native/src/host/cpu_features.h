// The one CPU-feature dispatch of the library: which instruction sets this process may use
// (detected once, thread-safe static), the kernel selection that narrows them, and the one-line CPU
// description kvr_backend_probe and the CPU backend report (cpu_description.cpp). Every kernel
// choice (GEMM table, q8/q4 and int8 kernels, AMX, the sampler's exp, attention/norm/convert AVX2
// paths, CRC32C) reads these predicates at each call — none caches its answer — so changing the
// selection re-selects all of them. Not the kernels themselves.
#pragma once

#include <atomic>
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

// The kernel selection: how far the GEMM, q8/q4/int8 and sampler-exp choices are narrowed below
// what the CPU has, so one machine runs every path it has. kBest: no narrowing; kAvx512 ("avx512"): AMX
// off (an AVX-512 machine without AMX, e.g. AMD Zen 4); kAvxVnni ("avxvnni"): AVX-512 off (AVX2 +
// AVX-VNNI, Alder Lake-like); kAvx2 ("avx2"): AVX-512 and AVX-VNNI off (an AVX2-only machine);
// kGeneric ("generic"): the portable kernels. The engine kernels (attention, norms, conversions)
// and CRC32C are not narrowed: the forced GEMM paths are checked to give the default path's logits
// bit for bit, with the same engine kernels underneath.
enum class KernelSelection : uint8_t { kBest, kAvx512, kAvxVnni, kAvx2, kGeneric };

// The current selection. Initially from the environment variable KVRELAY_CPU_KERNEL
// (generic|avx2|avxvnni|avx512; unset, empty or anything else: kBest), read at the first use.
KernelSelection kernel_selection();

// Changes the selection (the test library's kvr_test_set_cpu_kernel): nullptr or "" = kBest, else
// one of the names above. KVR_ERR_INVALID_ARGUMENT for an unknown name, KVR_ERR_UNSUPPORTED for a
// path this CPU cannot run (avx2 needs AVX2+FMA, avxvnni AVX-VNNI as well, avx512 AVX-512F), the
// reason recorded as kvr_last_error; the selection is then unchanged. Every choice made after it
// follows it. Not to be called while any other call of the library runs: one GEMM asks for its
// kernels more than once (its input packing and its tiles must agree).
int32_t set_kernel_selection(const char* name);

// What the CPU's features and the current selection allow, worked out once per selection: the
// kernel choices are asked for at every GEMM (and per work unit of a step), so each answer is one
// relaxed atomic load and a field, not a re-derivation.
struct KernelChoices {
  bool avx2_gemm = false;    // GEMM micro-kernels: AVX2 + FMA, unless generic
  bool avx512_gemm = false;  // ... on AVX-512F zmm (same bits as AVX2), unless generic/avx2/avxvnni
  bool avx512_vnni = false;  // q8/q4 kernels with AVX-512 F/BW/VL + VNNI, unless generic/avx2/avxvnni
  bool avx2_quant = false;   // q8/q4 kernels on ymm (AVX2 + FMA + F16C), unless generic
  bool avx_vnni = false;     // ... with AVX-VNNI's ymm vpdpbusd, unless avx2
  bool amx_bf16 = false;     // the AMX bf16 few-row GEMM (gemm_amx.h), unless any narrowing
  // The sampler's exp over a vocabulary (host/sampling.cpp; the same bits as the scalar exp) on
  // zmm registers, unless generic/avx2/avxvnni; on ymm with AVX2 + FMA, unless generic.
  bool avx512_exp = false, avx2_exp = false;
};

namespace detail {
extern std::atomic<const KernelChoices*> current_choices;  // null until the first use
const KernelChoices& init_choices();                        // sets it from the environment
}  // namespace detail

inline const KernelChoices& kernel_choices() {
  const KernelChoices* c = detail::current_choices.load(std::memory_order_relaxed);
  return c != nullptr ? *c : detail::init_choices();
}

// Engine kernels (attention, norms, conversions): AVX2 + FMA + F16C together.
inline bool use_avx2_fma_f16c() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c;
}
inline bool use_avx2_gemm() { return kernel_choices().avx2_gemm; }
inline bool use_avx512_gemm() { return kernel_choices().avx512_gemm; }
inline bool use_avx512_vnni() { return kernel_choices().avx512_vnni; }
inline bool use_avx2_quant() { return kernel_choices().avx2_quant; }
inline bool use_avx_vnni() { return kernel_choices().avx_vnni; }
inline bool use_amx_bf16() { return kernel_choices().amx_bf16; }
inline bool use_avx512_exp() { return kernel_choices().avx512_exp; }
inline bool use_avx2_exp() { return kernel_choices().avx2_exp; }
// CRC32C with the SSE4.2 crc32 instruction.
inline bool use_sse42_crc() { return cpu_features().sse42; }

// "cpu: <model name from /proc/cpuinfo>, <N> cores, <simd path> kernels".
std::string cpu_description();

}  // namespace kvr::cpu
