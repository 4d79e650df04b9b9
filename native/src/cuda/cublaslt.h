// cuBLASLt loaded at run time with dlopen (no cuBLAS headers or libraries at build time): the few
// functions and enum values the prefill GEMMs use, declared by hand (scripts/gpu_check checks them
// against the real cublasLt.h with static_asserts where that header exists). One instance per
// process; per-shape algorithm choices are cached. Not a general cuBLAS wrapper.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

namespace kvr::cuda::lt {

// The subset of cublasLt.h we rely on (values from cublasLt.h / library_types.h, CUDA 12-13).
using Handle = void*;
using MatmulDesc = void*;
using MatrixLayout = void*;
using Preference = void*;
using Status = int;  // cublasStatus_t, 0 = CUBLAS_STATUS_SUCCESS
struct Algo {
  uint64_t data[8];
};
struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  Algo algo;
  size_t workspaceSize;
  Status state;
  float wavesCount;
  int reserved[4];
};
constexpr int kComputeF32 = 68;        // CUBLAS_COMPUTE_32F
constexpr int kR32F = 0;               // CUDA_R_32F
constexpr int kR16BF = 14;             // CUDA_R_16BF
constexpr int kDescTransA = 3;         // CUBLASLT_MATMUL_DESC_TRANSA
constexpr int kDescTransB = 4;         // CUBLASLT_MATMUL_DESC_TRANSB
constexpr int kOpN = 0, kOpT = 1;      // CUBLAS_OP_N, CUBLAS_OP_T
constexpr int kPrefMaxWorkspace = 1;   // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES

// Bytes of workspace each sequence gives the matmuls.
constexpr size_t kWorkspaceBytes = 32u << 20;

class CublasLt {
 public:
  // Loads libcublasLt.so.13 or .so.12 (the loader's search path: LD_LIBRARY_PATH, rpath, cache)
  // and creates a handle on the current device. Never throws; ok() says whether it worked and
  // describe() says what was found or why not.
  static CublasLt& instance();
  bool ok() const { return handle_ != nullptr; }
  const std::string& describe() const { return what_; }

  // C (m, n) row-major f32 (ldc) [= or +=] A (m, k) bf16 row-major (lda) · W (n, k) bf16 row-major ᵀ.
  // Returns a cublasStatus_t (0 on success).
  Status matmul_bf16(const uint16_t* a, size_t lda, uint32_t m, const uint16_t* w, uint32_t n, uint32_t k, float* c,
                     size_t ldc, bool accumulate, void* workspace, size_t workspace_bytes, cudaStream_t stream);

 private:
  CublasLt();
  void* lib_ = nullptr;
  Handle handle_ = nullptr;
  std::string what_;
  std::mutex mu_;
  std::map<std::tuple<uint32_t, uint32_t, uint32_t, size_t, size_t, bool>, Algo> algos_;
  bool have_algo_ = false;

  Status (*create_)(Handle*) = nullptr;
  Status (*desc_create_)(MatmulDesc*, int, int) = nullptr;
  Status (*desc_destroy_)(MatmulDesc) = nullptr;
  Status (*desc_set_)(MatmulDesc, int, const void*, size_t) = nullptr;
  Status (*layout_create_)(MatrixLayout*, int, uint64_t, uint64_t, int64_t) = nullptr;
  Status (*layout_destroy_)(MatrixLayout) = nullptr;
  Status (*pref_create_)(Preference*) = nullptr;
  Status (*pref_destroy_)(Preference) = nullptr;
  Status (*pref_set_)(Preference, int, const void*, size_t) = nullptr;
  Status (*heuristic_)(Handle, MatmulDesc, MatrixLayout, MatrixLayout, MatrixLayout, MatrixLayout, Preference, int,
                       HeuristicResult*, int*) = nullptr;
  Status (*matmul_)(Handle, MatmulDesc, const void*, const void*, MatrixLayout, const void*, MatrixLayout,
                    const void*, const void*, MatrixLayout, void*, MatrixLayout, const Algo*, void*, size_t,
                    cudaStream_t) = nullptr;
  size_t (*version_)() = nullptr;
};

}  // namespace kvr::cuda::lt
