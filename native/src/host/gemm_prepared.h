// A GEMM input prepared once for several weight-panel ranges of one GEMM: packed f32 tiles for
// f32/bf16 weights (gemm_pack_a), three bf16 planes for the AMX tiles with bf16 weights and at
// least amx::kMinRows rows where the CPU has AMX (gemm_amx.h), int8 codes per 32-block for q8/q4
// weights (gemm_int8.h) — for
// the threads of the batched step (cpu/batch_forward.cpp), each taking several panel chunks of a
// GEMM: preparing per chunk cost about half as much as the multiplications at 32 rows. The sums
// are those of matmul_xwt for the same input. Not for one row (the GEMV reads x in place).
#pragma once

#include <cstddef>
#include <vector>

#include "host/gemm.h"
#include "host/gemm_amx.h"
#include "host/gemm_int8.h"

namespace kvr::cpu {

class PreparedRows {
 public:
  // Prepares x (m, k = w.cols(), row stride ldx) for w's format. Throws std::bad_alloc (the
  // buffers grow to the largest input seen and are kept).
  void prepare(const float* x, size_t m, size_t ldx, const PackedWeight& w);

  // y (m, n) (+)= the prepared rows · Wᵀ on weight panels [p0, p1), on the calling thread. w has
  // the format and k of the prepare() call. Does not allocate or throw.
  void gemm_range(const PackedWeight& w, float* y, size_t ldy, bool accumulate, size_t p0, size_t p1) const;

  // Whether the last prepare() chose the AMX tiles.
  bool amx() const { return amx_; }

 private:
  size_t m_ = 0;
  bool quant_ = false;
  bool amx_ = false;
  amx::SplitRows split_;                              // bf16 weights on AMX
  std::vector<float, AlignedAllocator<float>> pack_;  // f32/bf16 weights: gemm_pack_a
  int8::QuantRows q_;                                 // q8/q4 weights
};

}  // namespace kvr::cpu
