// g++ test of the CUDA stub (cuda_stub.cpp), the file a build without CUDA links: cuda_probe and
// make_cuda_backend must answer KVR_ERR_UNSUPPORTED with the documented reason. Built by CMake as
// kvr_cuda_stub_test in every build (the library itself links the stub only without CUDA); run by
// cuda_stub_test.ts. Exit status 1 on failure.
#include <cstdio>
#include <string>

#include "core/backend.h"

int main() {
  const std::string want = "built without CUDA support (nvcc not found at build time)";
  int failures = 0;
  std::string info = "stale";
  const int32_t st = kvr::cuda_probe(0, info);
  if (st != KVR_ERR_UNSUPPORTED || info != want) {
    std::printf("cuda_probe: status %d, info \"%s\"\n", st, info.c_str());
    ++failures;
  }
  kvr::ModelGeometry g;
  kvr::TensorTable t(1);
  try {
    auto b = kvr::make_cuda_backend(g, t, 0);
    std::printf("make_cuda_backend returned a backend\n");
    ++failures;
  } catch (const kvr::BackendError& e) {
    if (e.status != KVR_ERR_UNSUPPORTED || e.message != want) {
      std::printf("make_cuda_backend: status %d, message \"%s\"\n", e.status, e.message.c_str());
      ++failures;
    }
  }
  std::printf("cuda_stub: %d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
