// RoPE parameter checks and inverse frequencies: transformers' default, linear and llama3
// (_compute_llama3_parameters).
#include "host/rope.h"

#include <cmath>

#include "core/errors.h"

namespace kvr {

namespace {
constexpr double kPi = 3.14159265358979323846;
}  // namespace

namespace {
bool finite_pos(float v) { return std::isfinite(v) && v > 0.f; }
}  // namespace

int32_t check_rope(const kvr_model_params& p, std::string* why) {
  auto bad = [why](int32_t st, std::string msg) {
    *why = std::move(msg);
    return st;
  };
  if (!finite_pos(p.rope_theta))
    return bad(KVR_ERR_INVALID_ARGUMENT, format("rope_theta must be finite and > 0, got %g", p.rope_theta));
  if (p.rope_scaling > KVR_ROPE_LLAMA3)
    return bad(KVR_ERR_UNSUPPORTED, format("unsupported rope_scaling %u (0 none, 1 linear, 2 llama3)", p.rope_scaling));
  if (p.rope_scaling != KVR_ROPE_NONE && !finite_pos(p.rope_factor))
    return bad(KVR_ERR_INVALID_ARGUMENT, format("rope_factor must be finite and > 0, got %g", p.rope_factor));
  if (p.rope_scaling == KVR_ROPE_LLAMA3) {
    if (!finite_pos(p.rope_low_freq_factor) || !finite_pos(p.rope_high_freq_factor))
      return bad(KVR_ERR_INVALID_ARGUMENT,
                 format("llama3 rope low/high freq factors must be finite and > 0, got %g / %g",
                        p.rope_low_freq_factor, p.rope_high_freq_factor));
    if (!(p.rope_high_freq_factor > p.rope_low_freq_factor))
      return bad(KVR_ERR_INVALID_ARGUMENT,
                 format("llama3 rope_high_freq_factor %g must exceed rope_low_freq_factor %g",
                        p.rope_high_freq_factor, p.rope_low_freq_factor));
    if (p.rope_original_max_position == 0)
      return bad(KVR_ERR_INVALID_ARGUMENT, "llama3 rope_original_max_position must be > 0, got 0");
  }
  return KVR_OK;
}

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
