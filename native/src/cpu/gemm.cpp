// Placeholder portable GEMM (row-major W, no packing) so the engine builds; the packed AVX2/FMA
// kernel with runtime dispatch replaces it.
#include "cpu/gemm.h"

namespace kvr::cpu {

PackedWeight PackedWeight::pack(const float* w, size_t n, size_t k) {
  PackedWeight p;
  p.n_ = n;
  p.k_ = k;
  p.data_.assign(w, w + n * k);
  return p;
}

void matmul_xwt(const float* x, size_t m, size_t ldx, const PackedWeight& w, float* y,
                size_t ldy, bool accumulate, int n_threads) {
  const size_t n = w.rows(), k = w.cols();
  const float* wd = w.data();
#pragma omp parallel for num_threads(n_threads) schedule(static) collapse(2)
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      float acc = 0.f;
      for (size_t t = 0; t < k; ++t) acc += x[i * ldx + t] * wd[j * k + t];
      y[i * ldy + j] = accumulate ? y[i * ldy + j] + acc : acc;
    }
  }
}

const char* kernel_name() { return "generic"; }

}  // namespace kvr::cpu
