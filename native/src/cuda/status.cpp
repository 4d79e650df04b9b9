// CUDA error mapping (status.h).
#include "cuda/status.h"

#include "core/backend.h"
#include "core/errors.h"
#include "kvrelay.h"

namespace kvr::cuda {

CudaStatus map_cuda_error(cudaError_t e, const char* what) {
  CudaStatus s;
  s.message = format("%s: %s (%d): %s", what, cudaGetErrorName(e), static_cast<int>(e), cudaGetErrorString(e));
  s.sticky = false;
  switch (e) {
    case cudaErrorMemoryAllocation:
      s.status = KVR_ERR_OUT_OF_MEMORY;
      break;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      s.status = KVR_ERR_UNSUPPORTED;
      break;
    // Faults during kernel execution corrupt the context: every later call fails too.
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorDevicesUnavailable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorUnknown:
      s.status = KVR_ERR_INTERNAL;
      s.sticky = true;
      break;
    default:
      s.status = KVR_ERR_INTERNAL;
      break;
  }
  return s;
}

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  CudaStatus s = map_cuda_error(e, what);
  throw BackendError(s.status, std::move(s.message));
}

}  // namespace kvr::cuda
