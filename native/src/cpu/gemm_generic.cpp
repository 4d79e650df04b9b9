// Portable micro-kernels for the packed GEMM (plain C++, auto-vectorised at the baseline ISA):
// the fallback for CPUs without AVX2/FMA and the path KVRELAY_CPU_KERNEL=generic forces.
// Same packed layout and contracts as gemm_avx2.cpp (see gemm_kernels.h).
#include "cpu/gemm_kernels.h"

namespace kvr::cpu::detail {
namespace {

// c (MR, 16) (+)= a (kc, 6)[:, :MR] · b (kc, 16); see TileFn. Done as two 8-column halves so
// the MR x 8 accumulators fit the 16 registers of baseline SSE once the compiler vectorises the
// column loop (the A slice is read twice, from L1).
template <int MR>
void tile_generic(size_t kc, const float* a, const float* b, float* c, size_t ldc, bool load_c) {
  for (int h = 0; h < 2; ++h) {
    const float* bh = b + 8 * h;
    float acc[MR][8] = {};
    for (size_t t = 0; t < kc; ++t) {
      const float* bt = bh + t * 16;
      const float* at = a + t * kTileRows;
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) {
        const float av = at[r];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) acc[r][j] += av * bt[j];
      }
    }
    for (int r = 0; r < MR; ++r) {
      float* row = c + r * ldc + 8 * h;
      for (int j = 0; j < 8; ++j) row[j] = load_c ? row[j] + acc[r][j] : acc[r][j];
    }
  }
}

// See GemvFn: one accumulator per output, summed over kc in order (as tile_generic does), in
// two 8-column halves like tile_generic so the compiler keeps the accumulators in registers.
void gemv_generic(size_t kc, const float* x, const float* b, size_t panel_stride,
                  size_t n_panels, float* y, bool load_y) {
  for (size_t q = 0; q < n_panels; ++q) {
    for (int h = 0; h < 2; ++h) {
      const float* bh = b + q * panel_stride + 8 * h;
      float acc[8] = {};
      for (size_t t = 0; t < kc; ++t) {
        const float xv = x[t];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) acc[j] += xv * bh[t * 16 + j];
      }
      float* out = y + q * 16 + 8 * h;
      for (int j = 0; j < 8; ++j) out[j] = load_y ? out[j] + acc[j] : acc[j];
    }
  }
}

}  // namespace

const KernelTable& generic_kernels() {
  static const KernelTable table = {
      "generic",
      {nullptr, &tile_generic<1>, &tile_generic<2>, &tile_generic<3>, &tile_generic<4>,
       &tile_generic<5>, &tile_generic<6>},
      &gemv_generic};
  return table;
}

}  // namespace kvr::cpu::detail
