// The CUDA entry points of a build without CUDA (CMake links this file when nvcc was not found or
// KVR_CUDA is off): every model asking for KVR_BACKEND_CUDA and every probe gets a clean
// KVR_ERR_UNSUPPORTED with the reason. Not the CUDA backend (native/src/cuda/).
#include <memory>
#include <string>

#include "core/backend.h"

namespace kvr {
namespace {
constexpr const char* kNoCuda = "built without CUDA support (nvcc not found at build time)";
}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const ModelGeometry&, const TensorTable&, int32_t) {
  throw BackendError(KVR_ERR_UNSUPPORTED, kNoCuda);
}

int32_t cuda_probe(int32_t, std::string& info) {
  info = kNoCuda;
  return KVR_ERR_UNSUPPORTED;
}

}  // namespace kvr
