// The AMX path of the few-row GEMM (Intel AMX-TILE + AMX-BF16, Sapphire Rapids and later): the
// f32 input rows are split exactly into three bf16 planes (x = hi + mid + lo: each plane takes the
// next 8 significant bits of x, truncated, so the sum is x bit for bit apart from bf16 denormals,
// |x| < 2^-126·2^16), and each bf16 weight panel is multiplied with all three by TDPBF16PS — the
// products are exact in f32, the sums f32 with the tile unit's rounding: a different summation
// order from the AVX-512 tiles (≈1e-7 relative apart), not other arithmetic. 3–4× the AVX-512
// tiles' speed at 32 rows (docs/gemm.md "AMX"). Used for bf16 weights and ≥ kMinRows rows when
// use_amx_bf16() says so: by PreparedRows (host/gemm_prepared.h: a decode batch and its lm_head)
// and by matmul_xwt / gemm_range (prefill). Not for f32/q8/q4 weights or one row (GEMV).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "host/cpu_features.h"
#include "host/gemm.h"

namespace kvr::cpu::amx {

// Rows below which the AVX-512 tiles are kept (an AMX tile is 16 rows; fewer waste its work).
constexpr size_t kMinRows = 8;
// Whether a GEMM of m rows on w takes the AMX tiles: bf16 weights, at least kMinRows rows, and the
// CPU (and the thread's kernel cap, cpu_features.h) allows AMX. The one rule for every caller, so
// the same rows always get the same kernel (the batched step's row blocks rely on it).
inline bool applies(const PackedWeight& w, size_t m) { return w.is_bf16() && m >= kMinRows && use_amx_bf16(); }

// Rows split at a time by the prefill GEMMs: their three bf16 planes (6 bytes per input) stay
// in L2 while every weight panel passes, and a thread's buffers stay bounded (≤ 2.3 MiB at k 3072).
constexpr size_t kBlockRows = 128;

// x (m, k) as three bf16 planes, rows padded to 16 and k to 32 with zeros, for the tile loads.
class SplitRows {
 public:
  // Splits x (m, k, row stride ldx). Throws std::bad_alloc (buffers grow and are kept).
  void prepare(const float* x, size_t m, size_t ldx, size_t k);

  // y (m, n) (+)= the rows · Wᵀ on bf16 weight panels [p0, p1) of w (w.cols() == k of prepare),
  // on the calling thread. Does not allocate or throw.
  void gemm_range(const PackedWeight& w, float* y, size_t ldy, bool accumulate, size_t p0, size_t p1) const;

  size_t rows() const { return m_; }

 private:
  size_t m_ = 0, k_ = 0, mp_ = 0, kp_ = 0;
  std::vector<uint16_t, AlignedAllocator<uint16_t>> planes_;  // 3 × (mp_, kp_)
};

}  // namespace kvr::cpu::amx
