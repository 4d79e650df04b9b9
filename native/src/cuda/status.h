// CUDA status → kvrelay status and message, in one place: out of device memory is
// KVR_ERR_OUT_OF_MEMORY; no driver / no device / no kernel image for the device is
// KVR_ERR_UNSUPPORTED; everything else KVR_ERR_INTERNAL. `sticky` says whether the error leaves
// the CUDA context unusable (a kernel fault), after which the backend refuses further work.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace kvr::cuda {

struct CudaStatus {
  int32_t status;       // a kvr_status
  std::string message;  // "<what>: cudaErrorX (code): description"
  bool sticky;
};

CudaStatus map_cuda_error(cudaError_t e, const char* what);

// Throws kvr::BackendError for e != cudaSuccess (see map_cuda_error).
void check(cudaError_t e, const char* what);

}  // namespace kvr::cuda
