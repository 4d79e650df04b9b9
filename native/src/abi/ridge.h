// The kvr_ridge handle's layout, internal to the library: float64 ridge-fit statistics in the
// layout of the CPU Gram kernel (host/ridge_kernels.h). Shared by ridge.cpp (kvr_ridge_*) and
// ridge_seq.cpp (kvr_ridge_accumulate_seq, which adds rows or a backend's statistics). Not public ABI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

struct kvr_ridge {
  size_t n_in = 0, n_out = 0;
  size_t n1 = 0, w = 0;   // n_in + 1, n_in + 1 + n_out
  std::vector<double> a;  // (n1, w): [Gram | cross], upper block triangle of the Gram part
  std::vector<double> yy; // (n_out) Σ y²
  uint64_t rows = 0;
  std::string last_error;

  // Symmetric Gram entry G[i][j] (i, j < n1).
  double g(size_t i, size_t j) const {
    if (j < i) std::swap(i, j);
    // j >= i; stored when j >= 4·floor(i/4), which holds for every j >= i
    return a[i * w + j];
  }
  double c(size_t i, size_t o) const { return a[i * w + n1 + o]; }
};
