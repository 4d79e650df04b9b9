// cuda_probe (backend.h): is there a usable CUDA device, and what is it? One line for
// kvr_backend_probe and the model's device description; the reason when there is none (no driver,
// no device, compute capability below 8.0, no kernel image for the architecture).
#include <cuda_runtime.h>

#include <string>

#include "core/backend.h"
#include "core/errors.h"
#include "cuda/cublaslt.h"
#include "cuda/kernels.h"

namespace kvr {

int32_t cuda_probe(int32_t device, std::string& info) {
  try {
    int count = 0;  // left unwritten by a failing cudaGetDeviceCount
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      int driver = 0, runtime = 0;
      cudaDriverGetVersion(&driver);
      cudaRuntimeGetVersion(&runtime);
      info = e != cudaSuccess ? format("no CUDA device: %s (%d): %s (driver API %d, runtime %d)", cudaGetErrorName(e),
                                       static_cast<int>(e), cudaGetErrorString(e), driver, runtime)
                              : std::string("no CUDA device: the driver reports 0 devices");
      return KVR_ERR_UNSUPPORTED;
    }
    if (device < 0 || device >= count) {
      info = format("CUDA device %d does not exist (%d device%s)", device, count, count == 1 ? "" : "s");
      return KVR_ERR_OUT_OF_RANGE;
    }
    cudaError_t st = cudaSetDevice(device);
    cudaDeviceProp prop{};
    if (st == cudaSuccess) st = cudaGetDeviceProperties(&prop, device);
    if (st != cudaSuccess) {
      info = format("CUDA device %d unusable: %s (%d): %s", device, cudaGetErrorName(st), static_cast<int>(st),
                    cudaGetErrorString(st));
      return st == cudaErrorMemoryAllocation ? KVR_ERR_OUT_OF_MEMORY : KVR_ERR_UNSUPPORTED;
    }
    if (prop.major < 8) {
      info = format("CUDA device %d (%s) has compute capability %d.%d; the CUDA backend needs 8.0 or newer", device,
                    prop.name, prop.major, prop.minor);
      return KVR_ERR_UNSUPPORTED;
    }
    st = cuda::kernels_loadable();
    if (st != cudaSuccess) {
      info = format("CUDA device %d (%s, compute capability %d.%d): this build has no kernel image for it: %s (%d)",
                    device, prop.name, prop.major, prop.minor, cudaGetErrorName(st), static_cast<int>(st));
      return KVR_ERR_UNSUPPORTED;
    }
    int driver = 0;
    cudaDriverGetVersion(&driver);
    const cuda::lt::CublasLt& lt = cuda::lt::CublasLt::instance();
    info = format("cuda:%d %s, compute capability %d.%d, %d SMs, %.1f GiB, driver %d.%d, cuBLASLt %s", device,
                  prop.name, prop.major,
                  prop.minor, prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1u << 30),
                  driver / 1000, (driver % 1000) / 10,
                  lt.ok() ? ("found: " + lt.describe()).c_str() : ("absent (fallback GEMM): " + lt.describe()).c_str());
    return KVR_OK;
  } catch (const std::exception& ex) {
    info = std::string("CUDA probe failed: ") + ex.what();
    return KVR_ERR_INTERNAL;
  }
}

}  // namespace kvr
