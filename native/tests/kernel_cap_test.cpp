// g++ unit test of the per-computation kernel cap (host/cpu_features.h): what each cap allows
// (generic nothing vectorised, AMX only under auto, a cap never allows a path auto does not), that
// a KernelScope nests and restores, that it is per thread (another thread keeps auto meanwhile),
// and that every thread of a parallel region runs under its caller's cap: the worker pool
// (parallel_static / parallel_dynamic over Workers::kPool) and OpenMP (Workers::kOpenMP), with the
// workers back to auto for a later region without one. Prints "kernel_cap: N checks, M failed";
// exit status 1 on any failure. Built by CMake; run by kernel_cap_test.ts.
#include <atomic>
#include <cstdio>
#include <thread>
#include <utility>

#include "host/cpu_features.h"
#include "host/parallel_for.h"

namespace {

using kvr::cpu::KernelCap;
using kvr::cpu::KernelChoice;

size_t checks = 0, failed = 0;

void check(bool ok, const char* what, long a = 0, long b = 0) {
  ++checks;
  if (!ok) {
    ++failed;
    std::printf("FAIL %s: %ld vs %ld\n", what, a, b);
  }
}

constexpr KernelCap kCaps[] = {KernelCap::kAuto, KernelCap::kGeneric, KernelCap::kAvx2, KernelCap::kAvxVnni,
                               KernelCap::kAvx512};

long cap_now() { return static_cast<long>(kvr::cpu::current_choice().cap); }

void test_choices() {
  const KernelChoice& a = kvr::cpu::kernel_choice(KernelCap::kAuto);
  for (KernelCap cap : kCaps) {
    const KernelChoice& c = kvr::cpu::kernel_choice(cap);
    check(c.cap == cap, "the choice names its cap", static_cast<long>(c.cap), static_cast<long>(cap));
    // Narrowing only: nothing auto leaves off.
    const bool within = (!c.avx2_gemm || a.avx2_gemm) && (!c.avx512_gemm || a.avx512_gemm) &&
                        (!c.avx512_vnni || a.avx512_vnni) && (!c.avx2_quant || a.avx2_quant) &&
                        (!c.avx_vnni || a.avx_vnni) && (!c.amx_bf16 || a.amx_bf16) &&
                        (!c.avx512_exp || a.avx512_exp) && (!c.avx2_exp || a.avx2_exp);
    check(within, "a cap allows no path auto leaves off", static_cast<long>(cap));
    if (cap != KernelCap::kAuto) check(!c.amx_bf16, "AMX under auto only", static_cast<long>(cap));
    if (cap == KernelCap::kGeneric || cap == KernelCap::kAvx2 || cap == KernelCap::kAvxVnni)
      check(!c.avx512_gemm && !c.avx512_vnni && !c.avx512_exp, "no AVX-512 under generic/avx2/avxvnni",
            static_cast<long>(cap));
  }
  const KernelChoice& g = kvr::cpu::kernel_choice(KernelCap::kGeneric);
  check(!g.avx2_gemm && !g.avx2_quant && !g.avx_vnni && !g.avx2_exp, "generic: portable kernels only");
  check(!kvr::cpu::kernel_choice(KernelCap::kAvx2).avx_vnni, "avx2: no AVX-VNNI");
}

void test_scope() {
  check(kvr::cpu::current_choice_ptr() == nullptr, "auto outside any scope");
  {
    const kvr::cpu::KernelScope outer(KernelCap::kGeneric);
    check(cap_now() == 1, "generic inside its scope", cap_now(), 1);
    check(!kvr::cpu::use_avx2_gemm(), "the predicates follow the scope");
    {
      const kvr::cpu::KernelScope inner(KernelCap::kAuto);
      check(cap_now() == 0, "an auto scope inside generic", cap_now(), 0);
      check(kvr::cpu::use_avx2_gemm() == kvr::cpu::kernel_choice(KernelCap::kAuto).avx2_gemm,
            "auto's predicates inside it");
    }
    check(cap_now() == 1, "generic restored", cap_now(), 1);
    // Another thread, meanwhile: its own (auto) choice.
    long other = -1;
    std::thread t([&] { other = cap_now(); });
    t.join();
    check(other == 0, "another thread keeps auto", other, 0);
  }
  check(kvr::cpu::current_choice_ptr() == nullptr, "auto restored");
}

// Every index of a loop over `w` with `team` threads sees cap `want`; returns the threads seen.
unsigned region_caps(kvr::cpu::Workers w, bool dynamic, long want, const char* what) {
  constexpr size_t kCount = 64;
  std::atomic<unsigned> wrong{0}, threads{0};
  std::atomic<bool> seen[8] = {};
  auto body = [&](size_t, unsigned t) {
    if (cap_now() != want) wrong.fetch_add(1);
    if (t < 8 && !seen[t].exchange(true)) threads.fetch_add(1);
    // Long enough that the other thread takes indices too.
    for (volatile int spin = 0; spin < 20000; spin = spin + 1) {
    }
  };
  auto each = [&body](size_t i, unsigned t) { body(i, t); };  // the loops take their body as an rvalue
  if (dynamic) kvr::cpu::parallel_dynamic(w, 2, kCount, std::move(each));
  else kvr::cpu::parallel_static(w, 2, kCount, std::move(each));
  check(wrong.load() == 0, what, static_cast<long>(wrong.load()), 0);
  return threads.load();
}

void test_regions() {
  using kvr::cpu::Workers;
  for (Workers w : {Workers::kPool, Workers::kOpenMP}) {
    for (bool dynamic : {false, true}) {
      for (KernelCap cap : {KernelCap::kGeneric, KernelCap::kAvx2, KernelCap::kAvx512}) {
        const kvr::cpu::KernelScope scope(cap);
        const unsigned threads = region_caps(w, dynamic, static_cast<long>(cap), "every thread under the caller's cap");
        if (!dynamic) check(threads == 2, "a static loop ran on two threads", threads, 2);
      }
      region_caps(w, dynamic, 0, "the workers back to auto for a region without a cap");
    }
  }
}

}  // namespace

int main() {
  test_choices();
  test_scope();
  test_regions();
  std::printf("kernel_cap: %zu checks, %zu failed\n", checks, failed);
  return failed == 0 ? 0 : 1;
}
