// CPU feature detection (see cpu_features.h): __builtin_cpu_supports once per process and the
// kernel selection (KVRELAY_CPU_KERNEL, kvr_test_set_cpu_kernel). The description string is
// cpu_description.cpp (it names kernels).
#include "host/cpu_features.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>
#endif

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/errors.h"
#include "kvrelay.h"

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

struct SelectionName {
  const char* name;
  KernelSelection selection;
};
constexpr SelectionName kSelections[] = {{"generic", KernelSelection::kGeneric},
                                         {"avx2", KernelSelection::kAvx2},
                                         {"avxvnni", KernelSelection::kAvxVnni},
                                         {"avx512", KernelSelection::kAvx512}};

// The selection named `name`; false for a name that is none of kSelections.
bool parse_selection(const char* name, KernelSelection& out) {
  for (const SelectionName& s : kSelections) {
    if (std::strcmp(name, s.name) == 0) {
      out = s.selection;
      return true;
    }
  }
  return false;
}

// The environment's selection. A name the CPU lacks narrows nothing it has (the operator's knob
// keeps its lenient meaning: "avx512" on an AVX2 machine is the default); an unknown one is ignored.
KernelSelection selection_from_env() {
  const char* forced = std::getenv("KVRELAY_CPU_KERNEL");
  KernelSelection s = KernelSelection::kBest;
  if (forced != nullptr && !parse_selection(forced, s)) s = KernelSelection::kBest;
  return s;
}

KernelChoices choices_for(const CpuFeatures& f, KernelSelection s) {
  using S = KernelSelection;
  KernelChoices c;
  c.avx2_gemm = f.avx2 && f.fma && s != S::kGeneric;
  c.avx512_gemm = f.avx512f && c.avx2_gemm && s != S::kAvx2 && s != S::kAvxVnni;
  c.avx512_vnni = f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && s != S::kGeneric && s != S::kAvx2 &&
                  s != S::kAvxVnni;
  c.avx2_quant = f.avx2 && f.fma && f.f16c && s != S::kGeneric;
  c.avx_vnni = f.avxvnni && c.avx2_quant && s != S::kAvx2;
  c.amx_bf16 = f.amx_bf16 && c.avx512_vnni && s != S::kAvx512;
  c.avx512_exp = f.avx512f && s != S::kGeneric && s != S::kAvx2 && s != S::kAvxVnni;
  c.avx2_exp = f.avx2 && f.fma && s != S::kGeneric;
  return c;
}

constexpr size_t kSelectionCount = 5;

// The choices of every selection on this CPU, indexed by KernelSelection (immutable once built).
const KernelChoices* choices_table() {
  static const struct Table {
    KernelChoices c[kSelectionCount];
    Table() {
      for (size_t i = 0; i < kSelectionCount; ++i) c[i] = choices_for(cpu_features(), static_cast<KernelSelection>(i));
    }
  } table;
  return table.c;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

namespace detail {

std::atomic<const KernelChoices*> current_choices{nullptr};

const KernelChoices& init_choices() {
  const KernelChoices* c = &choices_table()[static_cast<size_t>(selection_from_env())];
  // Threads racing here store the same pointer; a selection set meanwhile wins.
  const KernelChoices* expected = nullptr;
  if (!current_choices.compare_exchange_strong(expected, c, std::memory_order_relaxed)) return *expected;
  return *c;
}

}  // namespace detail

KernelSelection kernel_selection() {
  return static_cast<KernelSelection>(&kernel_choices() - choices_table());
}

int32_t set_kernel_selection(const char* name) {
  KernelSelection s = KernelSelection::kBest;
  if (name != nullptr && name[0] != '\0' && !parse_selection(name, s)) {
    return fail(KVR_ERR_INVALID_ARGUMENT, format("unknown CPU kernel \"%s\" (expected generic, avx2, avxvnni, "
                                                 "avx512, or empty for the CPU's best)",
                                                 name));
  }
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma;
  const char* missing = nullptr;
  if (s == KernelSelection::kAvx2 && !avx2) missing = "AVX2 and FMA";
  if (s == KernelSelection::kAvxVnni && !(avx2 && f.f16c && f.avxvnni)) missing = "AVX2, FMA, F16C and AVX-VNNI";
  if (s == KernelSelection::kAvx512 && !(avx2 && f.avx512f)) missing = "AVX2, FMA and AVX-512F";
  if (missing != nullptr)
    return fail(KVR_ERR_UNSUPPORTED,
                format("CPU kernel \"%s\" is not supported on this CPU (it needs %s)", name, missing));
  detail::current_choices.store(&choices_table()[static_cast<size_t>(s)], std::memory_order_relaxed);
  return KVR_OK;
}

}  // namespace kvr::cpu
