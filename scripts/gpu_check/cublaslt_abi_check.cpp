// Compile-only check (scripts/gpu_check): the cuBLASLt declarations we make by hand in
// native/src/cuda/cublaslt.h agree with the real cublasLt.h. Built with -fsyntax-only where the
// header exists (the GPU machine: torch's nvidia-cublas wheel or a CUDA toolkit); never linked.
#include <cublasLt.h>

#include <cstddef>

#include "cuda/cublaslt.h"

namespace lt = kvr::cuda::lt;

static_assert(lt::kComputeF32 == CUBLAS_COMPUTE_32F, "CUBLAS_COMPUTE_32F");
static_assert(lt::kR32F == CUDA_R_32F, "CUDA_R_32F");
static_assert(lt::kR16BF == CUDA_R_16BF, "CUDA_R_16BF");
static_assert(lt::kDescTransA == CUBLASLT_MATMUL_DESC_TRANSA, "CUBLASLT_MATMUL_DESC_TRANSA");
static_assert(lt::kDescTransB == CUBLASLT_MATMUL_DESC_TRANSB, "CUBLASLT_MATMUL_DESC_TRANSB");
static_assert(lt::kOpN == CUBLAS_OP_N && lt::kOpT == CUBLAS_OP_T, "CUBLAS_OP_N/T");
static_assert(lt::kPrefMaxWorkspace == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, "MAX_WORKSPACE_BYTES");
static_assert(sizeof(lt::Algo) == sizeof(cublasLtMatmulAlgo_t), "cublasLtMatmulAlgo_t size");
static_assert(sizeof(lt::HeuristicResult) == sizeof(cublasLtMatmulHeuristicResult_t), "heuristic result size");
static_assert(offsetof(lt::HeuristicResult, workspaceSize) == offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize),
              "workspaceSize offset");
static_assert(offsetof(lt::HeuristicResult, state) == offsetof(cublasLtMatmulHeuristicResult_t, state), "state offset");
static_assert(sizeof(lt::Status) == sizeof(cublasStatus_t), "cublasStatus_t size");

// The function pointer types we cast dlsym results to match the real prototypes.
static_assert(sizeof(&cublasLtMatmul) == sizeof(void*), "function pointer");
using MatmulFn = cublasStatus_t (*)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*,
                                    cublasLtMatrixLayout_t, const void*, cublasLtMatrixLayout_t, const void*,
                                    const void*, cublasLtMatrixLayout_t, void*, cublasLtMatrixLayout_t,
                                    const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t);
static constexpr MatmulFn kMatmul = &cublasLtMatmul;
using LayoutFn = cublasStatus_t (*)(cublasLtMatrixLayout_t*, cudaDataType, uint64_t, uint64_t, int64_t);
static constexpr LayoutFn kLayout = &cublasLtMatrixLayoutCreate;
using DescFn = cublasStatus_t (*)(cublasLtMatmulDesc_t*, cublasComputeType_t, cudaDataType_t);
static constexpr DescFn kDesc = &cublasLtMatmulDescCreate;

int main() { return kMatmul && kLayout && kDesc ? 0 : 1; }
