// cuBLASLt through dlopen (see cublaslt.h). The row-major product C = A·Wᵀ is computed as the
// column-major Cᵀ (n, m) = W (k×n col-major, transposed) · Aᵀ (k×m col-major): opA = T on W,
// opB = N on A, no copies.
#include "cuda/cublaslt.h"

#include <dlfcn.h>

#include <cstdio>

namespace kvr::cuda::lt {

CublasLt& CublasLt::instance() {
  static CublasLt inst;  // thread-safe initialisation (C++11)
  return inst;
}

CublasLt::CublasLt() {
  const char* names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
  std::string tried;
  for (const char* n : names) {
    lib_ = dlopen(n, RTLD_NOW | RTLD_LOCAL);
    if (lib_) {
      what_ = n;
      break;
    }
    const char* err = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (err ? err : n);
  }
  if (!lib_) {
    what_ = "cuBLASLt not found (" + tried + ")";
    return;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib_, name));
    return fn != nullptr;
  };
  const bool all = sym(create_, "cublasLtCreate") && sym(desc_create_, "cublasLtMatmulDescCreate") &&
                   sym(desc_destroy_, "cublasLtMatmulDescDestroy") &&
                   sym(desc_set_, "cublasLtMatmulDescSetAttribute") &&
                   sym(layout_create_, "cublasLtMatrixLayoutCreate") &&
                   sym(layout_destroy_, "cublasLtMatrixLayoutDestroy") &&
                   sym(pref_create_, "cublasLtMatmulPreferenceCreate") &&
                   sym(pref_destroy_, "cublasLtMatmulPreferenceDestroy") &&
                   sym(pref_set_, "cublasLtMatmulPreferenceSetAttribute") &&
                   sym(heuristic_, "cublasLtMatmulAlgoGetHeuristic") && sym(matmul_, "cublasLtMatmul") &&
                   sym(version_, "cublasLtGetVersion");
  if (!all) {
    what_ += ": a cublasLt function is missing";
    return;
  }
  Handle h = nullptr;
  const Status st = create_(&h);
  if (st != 0) {
    what_ += ": cublasLtCreate failed with status " + std::to_string(st);
    return;
  }
  handle_ = h;
  what_ += " (version " + std::to_string(version_()) + ")";
}

Status CublasLt::matmul_bf16(const uint16_t* a, size_t lda, uint32_t m, const uint16_t* w, uint32_t n, uint32_t k,
                             float* c, size_t ldc, bool accumulate, void* workspace, size_t workspace_bytes,
                             cudaStream_t stream) {
  if (!handle_) return 7;  // CUBLAS_STATUS_INVALID_VALUE
  MatmulDesc desc = nullptr;
  MatrixLayout lw = nullptr, la = nullptr, lc = nullptr;
  Preference pref = nullptr;
  Status st = desc_create_(&desc, kComputeF32, kR32F);
  const int op_t = kOpT, op_n = kOpN;
  if (st == 0) st = desc_set_(desc, kDescTransA, &op_t, sizeof(op_t));
  if (st == 0) st = desc_set_(desc, kDescTransB, &op_n, sizeof(op_n));
  if (st == 0) st = layout_create_(&lw, kR16BF, k, n, static_cast<int64_t>(k));      // W as (k × n) col-major
  if (st == 0) st = layout_create_(&la, kR16BF, k, m, static_cast<int64_t>(lda));    // A as (k × m) col-major
  if (st == 0) st = layout_create_(&lc, kR32F, n, m, static_cast<int64_t>(ldc));     // C as (n × m) col-major
  Algo algo{};
  bool have = false;
  const auto key = std::make_tuple(m, n, k, lda, ldc, accumulate);
  if (st == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = algos_.find(key);
    if (it != algos_.end()) {
      algo = it->second;
      have = true;
    }
  }
  if (st == 0 && !have) {
    st = pref_create_(&pref);
    if (st == 0) st = pref_set_(pref, kPrefMaxWorkspace, &workspace_bytes, sizeof(workspace_bytes));
    HeuristicResult res{};
    int found = 0;
    if (st == 0) st = heuristic_(handle_, desc, lw, la, lc, lc, pref, 1, &res, &found);
    if (st == 0 && found < 1) st = 15;  // CUBLAS_STATUS_NOT_SUPPORTED
    if (st == 0) {
      algo = res.algo;
      std::lock_guard<std::mutex> lock(mu_);
      algos_[key] = algo;
    }
  }
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  if (st == 0) st = matmul_(handle_, desc, &alpha, w, lw, a, la, &beta, c, lc, c, lc, &algo, workspace, workspace_bytes,
                            stream);
  if (pref) pref_destroy_(pref);
  if (lc) layout_destroy_(lc);
  if (la) layout_destroy_(la);
  if (lw) layout_destroy_(lw);
  if (desc) desc_destroy_(desc);
  return st;
}

}  // namespace kvr::cuda::lt
