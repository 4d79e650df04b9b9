// RoPE from a model's params, shared by model load, the forward pass and the projector: the one
// validation of the RoPE fields, the inverse frequencies (HF transformers' default, linear and
// llama3 rules) and the one cos/sin table builder. Not the rotation itself (cpu/ops.h rope()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/device_math.h"
#include "kvrelay.h"

namespace kvr {

// Checks rope_theta (finite, > 0), rope_scaling (a kvr_rope_scaling: else KVR_ERR_UNSUPPORTED),
// rope_factor (finite, > 0 when scaled) and the llama3 fields (low/high freq factors finite and
// > 0, high > low, original_max_position > 0). KVR_OK, or a status with the reason in *why.
// theta only needs to be > 0 for the frequencies theta^(-2i/d) to be finite and positive; that
// is also what lib/model's config schema and transformers accept.
int32_t check_rope(const kvr_model_params& p, std::string* why);

// Inverse frequencies (head_dim/2 pairs, radians per position) in double, for checked params.
std::vector<double> rope_inv_freq(const kvr_model_params& p);

// The one cos/sin table builder: row t (at tab + t·ld) holds cos in [0, half) and sin in
// [half, 2·half) of (pos0 + t)·inv_freq[i], as f32 from dm::rope_cos_sin, the bits the forward
// pass rotates with on every backend (common/device_math.h). The projector re-rotates with these
// same values and de-rotates with them widened to double. Positions must be < 2^32.
inline void rope_cos_sin_rows(const std::vector<double>& inv_freq, size_t pos0, size_t tokens, float* tab,
                              size_t ld) {
  const size_t half = inv_freq.size();
  for (size_t t = 0; t < tokens; ++t) {
    float* row = tab + t * ld;
    const uint32_t pos = static_cast<uint32_t>(pos0 + t);
    for (size_t i = 0; i < half; ++i) dm::rope_cos_sin(pos, inv_freq[i], &row[i], &row[half + i]);
  }
}

}  // namespace kvr
