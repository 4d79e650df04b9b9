// PreparedRows (see gemm_prepared.h): the f32 packing of gemm.h, the AMX planes of gemm_amx.h or
// the int8 quantization of gemm_int8.h, chosen by the weight's format, the rows and the CPU.
#include "host/gemm_prepared.h"

namespace kvr::cpu {

void PreparedRows::prepare(const float* x, size_t m, size_t ldx, const PackedWeight& w) {
  m_ = m;
  quant_ = w.is_q8() || w.is_q4();
  amx_ = amx::applies(w, m);
  if (amx_) {
    split_.prepare(x, m, ldx, w.cols());
    return;
  }
  if (quant_) {
    q_.prepare(m, w);
    q_.quantize(x, ldx, w.cols(), 0, m);
    return;
  }
  const size_t floats = gemm_packed_a_floats(m, w.cols());
  if (pack_.size() < floats) pack_.resize(floats);
  gemm_pack_a(x, m, ldx, w.cols(), pack_.data());
}

void PreparedRows::gemm_range(const PackedWeight& w, float* y, size_t ldy, bool accumulate, size_t p0,
                              size_t p1) const {
  if (amx_) {
    split_.gemm_range(w, y, ldy, accumulate, p0, p1);
  } else if (quant_) {
    int8::gemm_rect(q_, w, y, ldy, accumulate, 0, m_, p0, std::min(p1, w.panels()));
  } else {
    gemm_packed_range(pack_.data(), m_, w, y, ldy, accumulate, p0, p1);
  }
}

}  // namespace kvr::cpu
