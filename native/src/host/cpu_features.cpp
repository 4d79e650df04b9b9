// CPU feature detection (see cpu_features.h): __builtin_cpu_supports once per process, and the
// predicates' answers under each KernelCap. The description string is cpu_description.cpp (it names kernels).
#include "host/cpu_features.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>
#endif

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif


namespace kvr::cpu {
namespace {

// Whether this process may use the AMX tile registers: Linux enables the 8 KiB tile state per
// process on request (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); refused (old kernel, a VM
// without it, a sigaltstack too small for the larger signal frame) means no AMX path.
[[maybe_unused]] bool amx_permitted() {
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
  __builtin_cpu_init();
  f.sse42 = __builtin_cpu_supports("sse4.2");
  f.avx512f = __builtin_cpu_supports("avx512f");
#if !defined(KVR_FORCE_GENERIC)
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = __builtin_cpu_supports("f16c");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  // GCC 12's __builtin_cpu_supports("avxvnni") answers 0 on CPUs that have it: read CPUID leaf
  // 7 subleaf 1 (EAX bit 4) directly; the OS's YMM state is implied by avx2 above.
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (f.avx2 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avxvnni = (a >> 4) & 1u;
  // CPUID 7.0 EDX: bit 22 AMX-BF16, bit 24 AMX-TILE.
  if (f.avx512f && __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1u) && ((d >> 24) & 1u))
    f.amx_bf16 = amx_permitted();
#endif
#endif
  return f;
}

KernelChoice choose(KernelCap cap) {
  const CpuFeatures& f = cpu_features();
  const bool generic = cap == KernelCap::kGeneric, avx2 = cap == KernelCap::kAvx2;
  const bool no_avx512 = generic || avx2 || cap == KernelCap::kAvxVnni;
  KernelChoice c;
  c.cap = cap;
  c.avx2_gemm = f.avx2 && f.fma && !generic;
  c.avx512_gemm = f.avx512f && c.avx2_gemm && !no_avx512;
  c.avx512_vnni = f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && !no_avx512;
  c.avx2_quant = f.avx2 && f.fma && f.f16c && !generic;
  c.avx_vnni = f.avxvnni && c.avx2_quant && !avx2;
  c.amx_bf16 = f.amx_bf16 && c.avx512_vnni && cap == KernelCap::kAuto;
  c.avx512_exp = f.avx512f && !no_avx512;
  c.avx2_exp = f.avx2 && f.fma && !generic;
  return c;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

const KernelChoice& kernel_choice(KernelCap cap) {
  static const std::array<KernelChoice, kKernelCaps> choices = [] {
    std::array<KernelChoice, kKernelCaps> c;
    for (size_t i = 0; i < kKernelCaps; ++i) c[i] = choose(static_cast<KernelCap>(i));
    return c;
  }();
  return choices[static_cast<size_t>(cap)];
}

}  // namespace kvr::cpu
