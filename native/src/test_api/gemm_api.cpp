// Test exports of the CPU GEMM (kvrelay_test.h): kvr_gemm_f32 (checked C = A·Bᵀ for tests),
// kvr_gemm_bench (median time of the model's packed kernel), kvr_gemv_quantized (a q8/q4
// weight's dequantized values and quantized GEMV, for tests), kvr_gemm_quantized (the model's
// GEMM with such a weight, for tests), kvr_gemm_few_rows_bf16 (the batched step's few-row GEMM
// with bf16 weights, for tests) and kvr_cpu_kernel_name; each but the bench under an explicit
// kvr_cpu_kernel cap (a KernelScope for the call, cpu_features.h).
// Argument checking lives here; the kernels (native/src/host/gemm*.cpp) trust their shapes.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <new>
#include <vector>

#include "core/errors.h"
#include "host/cpu_features.h"
#include "host/gemm.h"
#include "host/gemm_prepared.h"
#include "kvrelay_test.h"

namespace {

constexpr uint32_t kMaxThreads = 4096;
// kvr_gemm_bench allocates A, B, C itself: cap the total so a typo cannot exhaust memory.
constexpr size_t kBenchMaxFloats = size_t{1} << 30;  // 4 GiB of f32

// a * b into *out; false on size_t overflow.
bool mul_size(size_t a, size_t b, size_t* out) { return !__builtin_mul_overflow(a, b, out); }

// Resolves n_threads (0 = all cores available to the process) or records an error.
int32_t resolve_threads(uint32_t n_threads, int* out) {
  if (n_threads > kMaxThreads) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT,
                     kvr::format("n_threads is %u, at most %u allowed", n_threads, kMaxThreads));
  }
  *out = n_threads == 0 ? std::max(1, omp_get_num_procs()) : static_cast<int>(n_threads);
  return KVR_OK;
}

// Checks a kvr_cpu_kernel argument (0..4) or records an error.
int32_t check_cap(const char* fn, uint32_t cpu_kernel) {
  if (cpu_kernel > KVR_CPU_KERNEL_AVX512) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT,
                     kvr::format("%s: cpu_kernel %u is not a kvr_cpu_kernel (0 auto, 1 generic, 2 avx2, 3 avxvnni, "
                                 "4 avx512)",
                                 fn, cpu_kernel));
  }
  return KVR_OK;
}
kvr::cpu::KernelCap cap_of(uint32_t cpu_kernel) { return static_cast<kvr::cpu::KernelCap>(cpu_kernel); }

int32_t check_dims(uint32_t m, uint32_t n, uint32_t k) {
  if (m == 0 || n == 0 || k == 0) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT,
                     kvr::format("m, n, k must all be >= 1, got m=%u n=%u k=%u", m, n, k));
  }
  return KVR_OK;
}

// True when [p, p + a_bytes) and [q, q + b_bytes) share a byte.
bool overlaps(const void* p, size_t a_bytes, const void* q, size_t b_bytes) {
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(p), b0 = reinterpret_cast<uintptr_t>(q);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

// The checks kvr_gemm_quantized and kvr_gemm_few_rows_bf16 share: dimensions ≥ 1, sizes without
// overflow and below the cap, buffers long enough (w of w_elem bytes per value; x, y f32), y
// overlapping neither input. `fn` names the entry point in the messages.
int32_t check_gemm_buffers(const char* fn, uint32_t m, uint32_t n, uint32_t k, const void* w, size_t w_len,
                           size_t w_elem, const float* x, size_t x_len, const float* y, size_t y_len) {
  if (int32_t st = check_dims(m, n, k); st != KVR_OK) return st;
  size_t nk = 0, mk = 0, mn = 0;
  if (!mul_size(n, k, &nk) || !mul_size(m, k, &mk) || !mul_size(m, n, &mn) || nk > kBenchMaxFloats ||
      mk > kBenchMaxFloats || mn > kBenchMaxFloats) {
    return kvr::fail(KVR_ERR_OUT_OF_RANGE,
                     kvr::format("%s: m=%u n=%u k=%u exceeds %zu values", fn, m, n, k, kBenchMaxFloats));
  }
  if (w_len < nk || x_len < mk || y_len < mn) {
    return kvr::fail(KVR_ERR_OUT_OF_RANGE,
                     kvr::format("w has %zu values (n*k = %zu needed), x %zu (m*k = %zu), y %zu (m*n = %zu)", w_len,
                                 nk, x_len, mk, y_len, mn));
  }
  if (overlaps(y, mn * 4, w, nk * w_elem) || overlaps(y, mn * 4, x, mk * 4)) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT, kvr::format("%s: y overlaps w or x", fn));
  }
  return KVR_OK;
}

}  // namespace

extern "C" {

KVR_API int32_t kvr_gemm_f32(uint32_t m, uint32_t n, uint32_t k, const float* a, size_t a_len,
                             const float* b, size_t b_len, float* c, size_t c_len,
                             uint32_t n_threads, uint32_t cpu_kernel) {
  if (a == nullptr || b == nullptr || c == nullptr) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT,
                     kvr::format("kvr_gemm_f32: null buffer (a=%p b=%p c=%p)",
                                 static_cast<const void*>(a), static_cast<const void*>(b),
                                 static_cast<void*>(c)));
  }
  if (int32_t st = check_dims(m, n, k); st != KVR_OK) return st;
  if (int32_t st = check_cap("kvr_gemm_f32", cpu_kernel); st != KVR_OK) return st;
  int threads = 1;
  if (int32_t st = resolve_threads(n_threads, &threads); st != KVR_OK) return st;
  // Products of two u32 always fit a 64-bit size_t; checked anyway for 32-bit targets.
  size_t need_a = 0, need_b = 0, need_c = 0;
  if (!mul_size(m, k, &need_a) || !mul_size(n, k, &need_b) || !mul_size(m, n, &need_c) ||
      need_a > SIZE_MAX / sizeof(float) || need_b > SIZE_MAX / sizeof(float) ||
      need_c > SIZE_MAX / sizeof(float)) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT,
                     kvr::format("kvr_gemm_f32: m=%u n=%u k=%u overflows the address space", m,
                                 n, k));
  }
  if (a_len < need_a) {
    return kvr::fail(KVR_ERR_OUT_OF_RANGE,
                     kvr::format("a has %zu floats, m*k = %u*%u = %zu needed", a_len, m, k,
                                 need_a));
  }
  if (b_len < need_b) {
    return kvr::fail(KVR_ERR_OUT_OF_RANGE,
                     kvr::format("b has %zu floats, n*k = %u*%u = %zu needed", b_len, n, k,
                                 need_b));
  }
  if (c_len < need_c) {
    return kvr::fail(KVR_ERR_OUT_OF_RANGE,
                     kvr::format("c has %zu floats, m*n = %u*%u = %zu needed", c_len, m, n,
                                 need_c));
  }
  const size_t c_bytes = need_c * sizeof(float);
  if (overlaps(c, c_bytes, a, need_a * sizeof(float)) ||
      overlaps(c, c_bytes, b, need_b * sizeof(float))) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "kvr_gemm_f32: c overlaps a or b");
  }
  try {
    const kvr::cpu::KernelScope scope(cap_of(cpu_kernel));
    const kvr::cpu::PackedWeight w = kvr::cpu::PackedWeight::pack(b, n, k);
    kvr::cpu::matmul_xwt(a, m, k, w, c, n, false, threads);
  } catch (const std::bad_alloc&) {
    return kvr::fail(KVR_ERR_OUT_OF_MEMORY,
                     kvr::format("kvr_gemm_f32: cannot allocate the packed copy of b (%zu bytes)",
                                 need_b * sizeof(float)));
  } catch (...) {
    return kvr::fail(KVR_ERR_INTERNAL, "kvr_gemm_f32: unexpected exception");
  }
  return KVR_OK;
}

KVR_API int32_t kvr_gemm_bench(uint32_t m, uint32_t n, uint32_t k, uint32_t n_threads,
                               uint32_t iterations, double* out_seconds) {
  if (out_seconds == nullptr) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "kvr_gemm_bench: out_seconds is null");
  }
  if (int32_t st = check_dims(m, n, k); st != KVR_OK) return st;
  if (iterations == 0) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "kvr_gemm_bench: iterations must be >= 1, got 0");
  }
  int threads = 1;
  if (int32_t st = resolve_threads(n_threads, &threads); st != KVR_OK) return st;
  size_t na = 0, nb = 0, nc = 0;
  if (!mul_size(m, k, &na) || !mul_size(n, k, &nb) || !mul_size(m, n, &nc) ||
      na > kBenchMaxFloats || nb > kBenchMaxFloats || nc > kBenchMaxFloats ||
      na + nb + nc > kBenchMaxFloats) {
    return kvr::fail(KVR_ERR_OUT_OF_RANGE,
                     kvr::format("kvr_gemm_bench: m=%u n=%u k=%u needs more than %zu floats of "
                                 "buffers (the benchmark's cap)",
                                 m, n, k, kBenchMaxFloats));
  }
  try {
    // Deterministic inputs in [-1, 1): a 32-bit LCG, fixed seed.
    std::vector<float> a(na), b(nb), c(nc);
    uint32_t state = 12345u;
    auto next = [&state]() {
      state = state * 1664525u + 1013904223u;
      return static_cast<float>(state >> 8) * (2.0f / 16777216.0f) - 1.0f;
    };
    for (float& v : a) v = next();
    for (float& v : b) v = next();
    const kvr::cpu::PackedWeight w = kvr::cpu::PackedWeight::pack(b.data(), n, k);
    // Warm-up: page in c, allocate per-thread scratch, start the OpenMP team.
    kvr::cpu::matmul_xwt(a.data(), m, k, w, c.data(), n, false, threads);
    std::vector<double> times(iterations);
    for (uint32_t i = 0; i < iterations; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      kvr::cpu::matmul_xwt(a.data(), m, k, w, c.data(), n, false, threads);
      const auto t1 = std::chrono::steady_clock::now();
      times[i] = std::chrono::duration<double>(t1 - t0).count();
    }
    std::sort(times.begin(), times.end());
    const size_t mid = times.size() / 2;
    *out_seconds = times.size() % 2 == 1 ? times[mid] : 0.5 * (times[mid - 1] + times[mid]);
  } catch (const std::bad_alloc&) {
    return kvr::fail(KVR_ERR_OUT_OF_MEMORY,
                     kvr::format("kvr_gemm_bench: cannot allocate buffers for m=%u n=%u k=%u", m,
                                 n, k));
  } catch (...) {
    return kvr::fail(KVR_ERR_INTERNAL, "kvr_gemm_bench: unexpected exception");
  }
  return KVR_OK;
}

KVR_API int32_t kvr_gemv_quantized(uint32_t weights, uint32_t n, uint32_t k, const float* w,
                                   size_t w_len, const float* x, size_t x_len, float* w_deq,
                                   size_t w_deq_len, float* y, size_t y_len, uint32_t cpu_kernel) {
  if (w == nullptr || (y != nullptr && x == nullptr)) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "kvr_gemv_quantized: null w, or y without x");
  }
  if (weights > KVR_WEIGHTS_Q4) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT,
                     kvr::format("weights %u is not a kvr_weight_format (0 f32, 1 q8, 2 q4)", weights));
  }
  if (int32_t st = check_cap("kvr_gemv_quantized", cpu_kernel); st != KVR_OK) return st;
  if (int32_t st = check_dims(1, n, k); st != KVR_OK) return st;
  size_t nk = 0;
  if (!mul_size(n, k, &nk) || nk > kBenchMaxFloats) {
    return kvr::fail(KVR_ERR_OUT_OF_RANGE,
                     kvr::format("kvr_gemv_quantized: n=%u k=%u exceeds %zu weights", n, k, kBenchMaxFloats));
  }
  if (w_len < nk) {
    return kvr::fail(KVR_ERR_OUT_OF_RANGE, kvr::format("w has %zu floats, n*k = %zu needed", w_len, nk));
  }
  if (w_deq != nullptr && w_deq_len < nk) {
    return kvr::fail(KVR_ERR_OUT_OF_RANGE, kvr::format("w_deq has %zu floats, n*k = %zu needed", w_deq_len, nk));
  }
  if (y != nullptr && (x_len < k || y_len < n)) {
    return kvr::fail(KVR_ERR_OUT_OF_RANGE,
                     kvr::format("x has %zu floats (k = %u needed), y %zu (n = %u needed)", x_len, k, y_len, n));
  }
  if ((w_deq != nullptr && (overlaps(w_deq, nk * 4, w, nk * 4) ||
                            (x != nullptr && overlaps(w_deq, nk * 4, x, size_t{k} * 4)))) ||
      (y != nullptr && (overlaps(y, size_t{n} * 4, w, nk * 4) || overlaps(y, size_t{n} * 4, x, size_t{k} * 4) ||
                        (w_deq != nullptr && overlaps(y, size_t{n} * 4, w_deq, nk * 4))))) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "kvr_gemv_quantized: output buffers overlap inputs");
  }
  try {
    const kvr::cpu::KernelScope scope(cap_of(cpu_kernel));
    using kvr::cpu::PackedWeight;
    const PackedWeight pw = weights == KVR_WEIGHTS_Q8   ? PackedWeight::pack_q8(w, n, k)
                            : weights == KVR_WEIGHTS_Q4 ? PackedWeight::pack_q4(w, n, k)
                                                        : PackedWeight::pack(w, n, k);
    if (w_deq != nullptr) kvr::cpu::dequantize(pw, w_deq);
    if (y != nullptr) kvr::cpu::matmul_xwt(x, 1, k, pw, y, n, false, 1);
  } catch (const std::bad_alloc&) {
    return kvr::fail(KVR_ERR_OUT_OF_MEMORY, "kvr_gemv_quantized: cannot allocate the packed weight");
  } catch (...) {
    return kvr::fail(KVR_ERR_INTERNAL, "kvr_gemv_quantized: unexpected exception");
  }
  return KVR_OK;
}

KVR_API int32_t kvr_gemm_quantized(uint32_t weights, uint32_t m, uint32_t n, uint32_t k, const float* w,
                                   size_t w_len, const float* x, size_t x_len, float* y, size_t y_len,
                                   uint32_t accumulate, uint32_t n_threads, uint32_t cpu_kernel) {
  if (w == nullptr || x == nullptr || y == nullptr) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "kvr_gemm_quantized: null w, x or y");
  }
  if (weights > KVR_WEIGHTS_Q4) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT,
                     kvr::format("weights %u is not a kvr_weight_format (0 f32, 1 q8, 2 q4)", weights));
  }
  if (accumulate > 1) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT, kvr::format("accumulate is %u, 0 or 1 allowed", accumulate));
  }
  if (int32_t st = check_cap("kvr_gemm_quantized", cpu_kernel); st != KVR_OK) return st;
  int threads = 1;
  if (int32_t st = resolve_threads(n_threads, &threads); st != KVR_OK) return st;
  if (int32_t st = check_gemm_buffers("kvr_gemm_quantized", m, n, k, w, w_len, 4, x, x_len, y, y_len); st != KVR_OK)
    return st;
  try {
    const kvr::cpu::KernelScope scope(cap_of(cpu_kernel));
    using kvr::cpu::PackedWeight;
    const PackedWeight pw = weights == KVR_WEIGHTS_Q8   ? PackedWeight::pack_q8(w, n, k)
                            : weights == KVR_WEIGHTS_Q4 ? PackedWeight::pack_q4(w, n, k)
                                                        : PackedWeight::pack(w, n, k);
    kvr::cpu::matmul_xwt(x, m, k, pw, y, n, accumulate == 1, threads);
  } catch (const std::bad_alloc&) {
    return kvr::fail(KVR_ERR_OUT_OF_MEMORY, "kvr_gemm_quantized: cannot allocate the packed weight");
  } catch (...) {
    return kvr::fail(KVR_ERR_INTERNAL, "kvr_gemm_quantized: unexpected exception");
  }
  return KVR_OK;
}

KVR_API int32_t kvr_gemm_few_rows_bf16(uint32_t m, uint32_t n, uint32_t k, const uint16_t* w, size_t w_len,
                                       const float* x, size_t x_len, float* y, size_t y_len,
                                       uint32_t accumulate, uint32_t* out_amx, uint32_t cpu_kernel) {
  if (out_amx != nullptr) *out_amx = 0;
  if (w == nullptr || x == nullptr || y == nullptr) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "kvr_gemm_few_rows_bf16: null w, x or y");
  }
  if (accumulate > 1) {
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT, kvr::format("accumulate is %u, 0 or 1 allowed", accumulate));
  }
  if (int32_t st = check_cap("kvr_gemm_few_rows_bf16", cpu_kernel); st != KVR_OK) return st;
  if (int32_t st = check_gemm_buffers("kvr_gemm_few_rows_bf16", m, n, k, w, w_len, 2, x, x_len, y, y_len);
      st != KVR_OK)
    return st;
  try {
    const kvr::cpu::KernelScope scope(cap_of(cpu_kernel));
    using kvr::cpu::PackedWeight;
    const PackedWeight::Bf16Rows rows{w, n};
    const PackedWeight pw = PackedWeight::pack_bf16(&rows, 1, k);
    kvr::cpu::PreparedRows prepared;
    prepared.prepare(x, m, k, pw);
    prepared.gemm_range(pw, y, n, accumulate == 1, 0, pw.panels());
    if (out_amx != nullptr) *out_amx = prepared.amx() ? 1 : 0;
  } catch (const std::bad_alloc&) {
    return kvr::fail(KVR_ERR_OUT_OF_MEMORY, "kvr_gemm_few_rows_bf16: cannot allocate the packed weight");
  } catch (...) {
    return kvr::fail(KVR_ERR_INTERNAL, "kvr_gemm_few_rows_bf16: unexpected exception");
  }
  return KVR_OK;
}

KVR_API const char* kvr_cpu_kernel_name(uint32_t cpu_kernel) {
  if (check_cap("kvr_cpu_kernel_name", cpu_kernel) != KVR_OK) return nullptr;
  const kvr::cpu::KernelScope scope(cap_of(cpu_kernel));
  return kvr::cpu::kernel_name();
}

}  // extern "C"
