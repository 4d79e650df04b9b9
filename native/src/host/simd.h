// The target attribute for the engine's hand-vectorised kernels (attention, norms, conversions)
// and their runtime check. The build targets baseline x86-64; AVX2/FMA/F16C code is compiled per
// function with KVR_TARGET_AVX2 and chosen at run time by the one feature dispatch
// (cpu_features.h).
#pragma once

#include "host/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#define KVR_X86 1
#define KVR_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define KVR_X86 0
#define KVR_TARGET_AVX2
#endif

namespace kvr::cpu::simd {

// True when AVX2, FMA and F16C are all available (the engine uses them together); a build with
// -DKVR_FORCE_GENERIC reports false (cpu_features.cpp).
inline bool has_avx2() { return use_avx2_fma_f16c(); }

// AVX-512F zmm engine kernels besides (decode attention). Like has_avx2(), not narrowed by a
// kernel cap (cpu_features.h KernelCap): a cap picks GEMM kernels, whose forced paths are checked
// to give the default path's logits bit for bit — with the same attention underneath.
inline bool has_avx512f() { return has_avx2() && cpu_features().avx512f; }

}  // namespace kvr::cpu::simd
