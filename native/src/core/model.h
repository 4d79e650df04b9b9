// The loaded model, backend-neutral part: validated params and geometry (ModelGeometry: sizes,
// RoPE inverse frequencies, KV dtype) plus the Backend chosen at load that owns the weights.
// Immutable after load, shared by every sequence (std::shared_ptr), so concurrent calls on
// different sequences never write to it. Not the loader itself (model_load.cpp) nor any weights
// layout (the backends: cpu/cpu_backend.h, cuda/).
#pragma once

#include <memory>

#include "core/backend.h"
#include "kvrelay.h"

namespace kvr {

struct Model : ModelGeometry {
  std::unique_ptr<Backend> backend;  // never null after a successful load
};

}  // namespace kvr

struct kvr_model {
  std::shared_ptr<const kvr::Model> m;
};
