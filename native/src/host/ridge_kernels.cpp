// CPU kernels of the ridge fit (see ridge.h): the float64 Gram accumulation (4-row register
// blocks, AVX2 clone chosen at run time by the one feature dispatch) and a plain Cholesky
// factor/solve. No argument checks (native/src/abi/ridge.cpp).
#include "host/ridge_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "host/simd.h"

namespace kvr::cpu {

namespace {
constexpr size_t kRowChunk = 64;  // rows converted to float64 per Gram pass (bounds scratch)
}  // namespace

namespace {

// One 4-row block of the Gram update: rows i0..i0+3 of A (width w), columns j0..w-1, over the
// chunk z (rows, w) float64. The j loop is what the compiler vectorises.
template <int kUnused>
__attribute__((always_inline)) inline void gram_block(double* a, size_t w, size_t i0, size_t ni, const double* z, size_t rows) {
  const size_t j0 = i0;
  double* a0 = a + i0 * w;
  if (ni == 4) {
    double* a1 = a0 + w;
    double* a2 = a1 + w;
    double* a3 = a2 + w;
    for (size_t r = 0; r < rows; ++r) {
      const double* zr = z + r * w;
      const double c0 = zr[i0], c1 = zr[i0 + 1], c2 = zr[i0 + 2], c3 = zr[i0 + 3];
      for (size_t j = j0; j < w; ++j) {
        const double v = zr[j];
        a0[j] += c0 * v;
        a1[j] += c1 * v;
        a2[j] += c2 * v;
        a3[j] += c3 * v;
      }
    }
    return;
  }
  for (size_t q = 0; q < ni; ++q) {
    double* aq = a0 + q * w;
    for (size_t r = 0; r < rows; ++r) {
      const double* zr = z + r * w;
      const double c = zr[i0 + q];
      for (size_t j = j0; j < w; ++j) aq[j] += c * zr[j];
    }
  }
}

KVR_TARGET_AVX2 void gram_block_avx2(double* a, size_t w, size_t i0, size_t ni, const double* z,
                                     size_t rows) {
  gram_block<1>(a, w, i0, ni, z, rows);
}

void gram_block_generic(double* a, size_t w, size_t i0, size_t ni, const double* z, size_t rows) {
  gram_block<0>(a, w, i0, ni, z, rows);
}

}  // namespace

void ridge_accumulate(double* a, double* yy, size_t n_in, size_t n_out, const float* x,
                      const float* y, size_t rows, int n_threads) {
  const size_t n1 = n_in + 1, w = n1 + n_out;
  const bool avx2 = simd::has_avx2();
  std::vector<double> z(kRowChunk * w);  // (chunk rows, w) = [x, 1, y] in float64
  for (size_t r0 = 0; r0 < rows; r0 += kRowChunk) {
    const size_t nr = std::min(kRowChunk, rows - r0);
    for (size_t r = 0; r < nr; ++r) {
      double* zr = z.data() + r * w;
      const float* xr = x + (r0 + r) * n_in;
      const float* yr = y + (r0 + r) * n_out;
      for (size_t i = 0; i < n_in; ++i) zr[i] = xr[i];
      zr[n_in] = 1.0;
      for (size_t o = 0; o < n_out; ++o) {
        zr[n1 + o] = yr[o];
        yy[o] += static_cast<double>(yr[o]) * yr[o];
      }
    }
    const long blocks = static_cast<long>((n1 + 3) / 4);
    const double* zc = z.data();
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1)
    for (long b = 0; b < blocks; ++b) {
      const size_t i0 = static_cast<size_t>(b) * 4;
      const size_t ni = std::min<size_t>(4, n1 - i0);
      if (avx2) {
        gram_block_avx2(a, w, i0, ni, zc, nr);
      } else {
        gram_block_generic(a, w, i0, ni, zc, nr);
      }
    }
  }
}

long cholesky(double* s, size_t n, double rel_tol) {
  double max_diag = 0.0;
  for (size_t i = 0; i < n; ++i) max_diag = std::max(max_diag, std::fabs(s[i * n + i]));
  const double floor = rel_tol * max_diag;
  for (size_t j = 0; j < n; ++j) {
    double d = s[j * n + j];
    for (size_t k = 0; k < j; ++k) d -= s[j * n + k] * s[j * n + k];
    if (!(d > floor) || !std::isfinite(d)) return static_cast<long>(j);
    const double ljj = std::sqrt(d);
    s[j * n + j] = ljj;
    for (size_t i = j + 1; i < n; ++i) {
      double v = s[i * n + j];
      const double* li = s + i * n;
      const double* lj = s + j * n;
      for (size_t k = 0; k < j; ++k) v -= li[k] * lj[k];
      s[i * n + j] = v / ljj;
    }
  }
  return -1;
}

void cholesky_solve(const double* l, size_t n, double* b) {
  for (size_t i = 0; i < n; ++i) {  // L·u = b
    double v = b[i];
    for (size_t k = 0; k < i; ++k) v -= l[i * n + k] * b[k];
    b[i] = v / l[i * n + i];
  }
  for (size_t ii = n; ii-- > 0;) {  // Lᵀ·x = u
    double v = b[ii];
    for (size_t k = ii + 1; k < n; ++k) v -= l[k * n + ii] * b[k];
    b[ii] = v / l[ii * n + ii];
  }
}

}  // namespace kvr::cpu
