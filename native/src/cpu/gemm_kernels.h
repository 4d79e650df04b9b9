// Internal interface between the GEMM driver (gemm.cpp) and its micro-kernels
// (gemm_avx2.cpp, gemm_generic.cpp). Not part of the library's API; the driver picks one
// kernel table at runtime and calls it per micro-tile.
#pragma once

#include <cstddef>

namespace kvr::cpu::detail {

// Rows per packed A micro-panel (the tile kernels compute up to 6 x 16 outputs per call).
constexpr size_t kTileRows = 6;

// c (mr, 16) with row stride ldc (+)= a · b over kc steps, where mr is the table index (1..6):
//   a: packed rows, (kc, 6) k-major (only the first mr of each 6 are read)
//   b: one weight panel slice, (kc, 16) k-major
// load_c: add to c's contents (else overwrite).
using TileFn = void (*)(size_t kc, const float* a, const float* b, float* c, size_t ldc,
                        bool load_c);

// y (16 * n_panels) (+)= x (kc) · panels, for one input row (decode): panel q's (kc, 16)
// k-major slice starts at b + q * panel_stride. Writes all 16 * n_panels outputs (y must have
// room). Each output is summed in the same order as the tile kernels (one accumulator per
// output over kc, then added to y), so a row's result does not depend on m.
using GemvFn = void (*)(size_t kc, const float* x, const float* b, size_t panel_stride,
                        size_t n_panels, float* y, bool load_y);

struct KernelTable {
  const char* name;
  TileFn tile[kTileRows + 1];  // tile[mr] for mr = 1..6; tile[0] unused
  GemvFn gemv;
};

const KernelTable& generic_kernels();
// Only valid to call kernels from this table when the CPU has AVX2 and FMA.
const KernelTable& avx2_kernels();

}  // namespace kvr::cpu::detail
