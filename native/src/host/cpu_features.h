// The one CPU-feature dispatch of the library: which instruction sets this process may use,
// detected once (thread-safe static), and the one-line CPU description kvr_backend_probe and the
// CPU backend report. Every kernel choice (GEMM table, attention/norm/convert AVX2 paths, CRC32C)
// reads these predicates, under the KernelCap of the computation the thread runs (KernelScope).
// Not the kernels themselves.
#pragma once

#include <array>
#include <cstddef>
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

// Engine kernels (attention, norms, conversions): AVX2 + FMA + F16C together. Not narrowed by a
// KernelCap (their paths give the same bits as the portable code).
inline bool use_avx2_fma_f16c() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c;
}

// How far a computation may go among the kernel paths this CPU has, so one machine tests every
// path it can run, in one process: kGeneric forces the portable kernels; kAvx2 keeps AVX-512 and
// AVX-VNNI off (an AVX2-only machine); kAvxVnni keeps AVX-512 off (AVX2 + AVX-VNNI, Alder
// Lake-like); kAvx512 keeps AMX off (an AVX-512 machine without AMX, e.g. AMD Zen 4); kAuto
// takes every path the CPU has. The values are kvr_cpu_kernel's (kvrelay.h).
enum class KernelCap : uint8_t { kAuto, kGeneric, kAvx2, kAvxVnni, kAvx512 };
constexpr size_t kKernelCaps = 5;

// The predicates' answers under one cap, worked out once per process from cpu_features().
struct KernelChoice {
  KernelCap cap = KernelCap::kAuto;
  bool avx2_gemm = false, avx512_gemm = false, avx512_vnni = false, avx2_quant = false;
  bool avx_vnni = false, amx_bf16 = false, avx512_exp = false, avx2_exp = false;
};
const KernelChoice& kernel_choice(KernelCap cap);

namespace detail {
// The choice of the computation this thread runs (null: kAuto). Per thread, not per process:
// `deno test --parallel` runs many test modules in one process, each with its own cap, and two
// models of one process may be loaded with different caps. KernelScope sets it; the threads that
// compute for a call (worker pool jobs, OpenMP regions) install their caller's.
inline thread_local const KernelChoice* tls_choice = nullptr;
}  // namespace detail

// The calling thread's choice (kAuto unless a KernelScope is open).
inline const KernelChoice& current_choice() {
  const KernelChoice* c = detail::tls_choice;
  return c != nullptr ? *c : kernel_choice(KernelCap::kAuto);
}
// The pointer to carry to the threads that compute for the current call (null: kAuto).
inline const KernelChoice* current_choice_ptr() { return detail::tls_choice; }

// Sets the calling thread's choice for its lifetime and restores the previous one.
class KernelScope {
 public:
  explicit KernelScope(const KernelChoice* c) : saved_(detail::tls_choice) { detail::tls_choice = c; }
  explicit KernelScope(KernelCap cap) : KernelScope(cap == KernelCap::kAuto ? nullptr : &kernel_choice(cap)) {}
  ~KernelScope() { detail::tls_choice = saved_; }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  const KernelChoice* saved_;
};

// f() evaluated under each cap (index: the cap's value), for tables chosen once per cap.
template <typename F>
auto per_cap(F f) {
  std::array<decltype(f()), kKernelCaps> out{};
  for (size_t i = 0; i < kKernelCaps; ++i) {
    KernelScope scope(static_cast<KernelCap>(i));
    out[i] = f();
  }
  return out;
}
// The current choice's index into a per_cap table.
inline size_t cap_index() { return static_cast<size_t>(current_choice().cap); }

// GEMM micro-kernels: AVX2 + FMA, unless the cap is generic.
inline bool use_avx2_gemm() { return current_choice().avx2_gemm; }
// GEMM micro-kernels with AVX-512F zmm registers (same bits as AVX2), unless the cap is generic,
// avx2 or avxvnni.
inline bool use_avx512_gemm() { return current_choice().avx512_gemm; }
// q8/q4 weight kernels with AVX-512 VNNI (F/BW/VL + vpdpbusd), unless the cap is generic, avx2
// or avxvnni.
inline bool use_avx512_vnni() { return current_choice().avx512_vnni; }
// q8/q4 weight kernels on ymm (AVX2 + FMA + F16C for the f16 scales of q4), unless the cap is
// generic.
inline bool use_avx2_quant() { return current_choice().avx2_quant; }
// ... with AVX-VNNI's ymm vpdpbusd instead of vpmaddubsw/vpmaddwd, unless the cap is avx2.
inline bool use_avx_vnni() { return current_choice().avx_vnni; }
// The AMX bf16 few-row GEMM (gemm_amx.h), unless the cap is anything but auto.
inline bool use_amx_bf16() { return current_choice().amx_bf16; }
// The sampler's exp over a vocabulary on zmm registers (host/sampling.cpp; the same bits as the
// scalar exp), unless the cap is one without AVX-512.
inline bool use_avx512_exp() { return current_choice().avx512_exp; }
// ... on ymm registers with AVX2 + FMA, unless the cap is generic.
inline bool use_avx2_exp() { return current_choice().avx2_exp; }
// CRC32C with the SSE4.2 crc32 instruction.
inline bool use_sse42_crc() { return cpu_features().sse42; }

// "cpu: <model name from /proc/cpuinfo>, <N> cores, <simd path> kernels".
std::string cpu_description();

}  // namespace kvr::cpu
