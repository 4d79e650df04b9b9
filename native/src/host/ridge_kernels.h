// CPU kernels of the ridge fit (kvrelay.h kvr_ridge_*): the float64 Gram update and a Cholesky
// factor/solve. Shapes are trusted here; native/src/abi/ridge.cpp checks every argument.
#pragma once

#include <cstddef>

namespace kvr::cpu {

// A (n1, w) row-major float64, n1 = n_in + 1, w = n_in + 1 + n_out: A[i][j] += Σ_r z_r[i]·z_r[j]
// for z_r = [x_r, 1, y_r], only for j >= 4·floor(i/4) (the upper block triangle of the Gram part
// plus every cross column). yy[o] += Σ_r y_r[o]². rows of x (n_in) and y (n_out) f32.
void ridge_accumulate(double* a, double* yy, size_t n_in, size_t n_out, const float* x,
                      const float* y, size_t rows, int n_threads);

// In-place Cholesky s = L·Lᵀ of the n×n symmetric matrix s (lower triangle used and overwritten
// with L). Returns -1 on success, else the index of the first pivot that is not positive
// (<= rel_tol · max diagonal, or not finite).
long cholesky(double* s, size_t n, double rel_tol);
// Solves L·Lᵀ·x = b in place for one right-hand side b (n).
void cholesky_solve(const double* l, size_t n, double* b);

}  // namespace kvr::cpu
