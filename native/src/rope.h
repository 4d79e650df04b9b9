// RoPE inverse frequencies from a model's params, shared by the forward pass (model load) and the
// projector (de-rotation with the source's RoPE, re-rotation with the target's).
#pragma once

#include <vector>

#include "kvrelay.h"

namespace kvr {

// HF transformers inverse frequencies (default, linear, llama3) for head_dim/2 pairs, in double.
std::vector<double> rope_inv_freq(const kvr_model_params& p);

}  // namespace kvr
