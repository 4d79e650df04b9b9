// RoPE inverse frequencies: transformers' default, linear and llama3 (_compute_llama3_parameters).
#include "rope.h"

#include <cmath>

namespace kvr {

namespace {
constexpr double kPi = 3.14159265358979323846;
}  // namespace

std::vector<double> rope_inv_freq(const kvr_model_params& p) {
  const size_t half = p.head_dim / 2;
  std::vector<double> f(half);
  for (size_t i = 0; i < half; ++i) {
    double inv = std::pow(static_cast<double>(p.rope_theta), -2.0 * static_cast<double>(i) / p.head_dim);
    if (p.rope_scaling == KVR_ROPE_LINEAR) {
      inv /= p.rope_factor;
    } else if (p.rope_scaling == KVR_ROPE_LLAMA3) {
      const double factor = p.rope_factor, lo = p.rope_low_freq_factor, hi = p.rope_high_freq_factor;
      const double orig = p.rope_original_max_position;
      const double low_wl = orig / lo, high_wl = orig / hi;
      const double wl = 2.0 * kPi / inv;
      if (wl > low_wl) {
        inv = inv / factor;
      } else if (!(wl < high_wl)) {
        const double smooth = (orig / wl - lo) / (hi - lo);
        inv = (1.0 - smooth) * inv / factor + smooth * inv;
      }
    }
    f[i] = inv;
  }
  return f;
}

}  // namespace kvr
