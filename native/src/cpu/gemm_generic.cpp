// Portable micro-kernels for the packed GEMM (plain C++, auto-vectorised at the baseline ISA):
// the fallback for CPUs without AVX2/FMA and the path KVRELAY_CPU_KERNEL=generic forces.
// Same packed layout and contracts as gemm_avx2.cpp (see gemm_kernels.h).
#include <cstring>

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

// y (16 * n_panels) (+)= x (k) · panels; see GemvFn.
void gemv_generic(size_t k, const float* x, const float* panels, size_t n_panels, float* y,
                  bool load_y) {
  for (size_t p = 0; p < n_panels; ++p) {
    const float* b = panels + p * k * 16;
    float acc[2][16];
    std::memset(acc, 0, sizeof(acc));
    size_t t = 0;
    for (; t + 2 <= k; t += 2) {
      for (int j = 0; j < 16; ++j) acc[0][j] += x[t] * b[t * 16 + j];
      for (int j = 0; j < 16; ++j) acc[1][j] += x[t + 1] * b[(t + 1) * 16 + j];
    }
    for (; t < k; ++t) {
      for (int j = 0; j < 16; ++j) acc[0][j] += x[t] * b[t * 16 + j];
    }
    float* out = y + p * 16;
    for (int j = 0; j < 16; ++j) {
      const float s = acc[0][j] + acc[1][j];
      out[j] = load_y ? out[j] + s : s;
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
