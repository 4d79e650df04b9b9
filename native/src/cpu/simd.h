// Runtime CPU feature checks for the engine's hand-vectorised kernels (attention, norms,
// conversions). The build targets baseline x86-64; AVX2/FMA/F16C code is compiled per function
// with KVR_TARGET_AVX2 and chosen here at run time. Not the GEMM's dispatch (gemm.cpp owns that).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#define KVR_X86 1
#define KVR_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define KVR_X86 0
#define KVR_TARGET_AVX2
#endif

namespace kvr::cpu::simd {

// True when AVX2, FMA and F16C are all available (the engine uses them together).
// Building with -DKVR_FORCE_GENERIC disables them (used to test the portable paths).
inline bool has_avx2() {
#if KVR_X86 && !defined(KVR_FORCE_GENERIC)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}

}  // namespace kvr::cpu::simd
