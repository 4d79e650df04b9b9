// Small row-wise kernels of the forward pass: RMSNorm, rotate-half RoPE, SwiGLU, bias add.
// Each works on one row (one token or one head); callers parallelise over rows.
#pragma once

#include <cstddef>

namespace kvr::cpu {

// y (d) = x * rsqrt(mean(x²) + eps) * w; the mean is accumulated in double. y may alias x.
void rmsnorm(const float* x, float* y, const float* w, size_t d, float eps);
// Rotate-half RoPE in place on one head (2*half): pairs (i, i+half) rotated by (cos[i], sin[i]).
void rope(float* x, const float* cos, const float* sin, size_t half);
// out (n) = silu(gate) * up; out may alias gate.
void swiglu(const float* gate, const float* up, float* out, size_t n);
// y (n) += b (n).
void add_inplace(float* y, const float* b, size_t n);

}  // namespace kvr::cpu
