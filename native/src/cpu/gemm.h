// The CPU matrix multiply every linear layer uses: y = x · Wᵀ with W pre-packed at load.
// Only the interface lives here; gemm.cpp holds the kernels and their runtime dispatch.
#pragma once

#include <cstddef>
#include <vector>

namespace kvr::cpu {

// A weight W (n rows = output features, k cols = input features), row-major f32 on input,
// stored in the layout the micro-kernel reads. Immutable after pack(); safe to share across threads.
class PackedWeight {
 public:
  PackedWeight() = default;
  // Copies and repacks w (n, k) row-major. Throws std::bad_alloc on allocation failure.
  static PackedWeight pack(const float* w, size_t n, size_t k);
  size_t rows() const { return n_; }  // n: output features
  size_t cols() const { return k_; }  // k: input features
  const float* data() const { return data_.data(); }
  size_t size_bytes() const { return data_.size() * sizeof(float); }

 private:
  size_t n_ = 0;
  size_t k_ = 0;
  std::vector<float> data_;
};

// y (m, n) with row stride ldy = x (m, k) with row stride ldx · Wᵀ; when accumulate, y += x · Wᵀ.
// Runs on n_threads OpenMP threads (>= 1). Bounds are the caller's: shapes come from the model.
void matmul_xwt(const float* x, size_t m, size_t ldx, const PackedWeight& w, float* y,
                size_t ldy, bool accumulate, int n_threads);

// Name of the kernel chosen at runtime for this CPU ("avx2-fma" or "generic").
const char* kernel_name();

}  // namespace kvr::cpu
