// Portable micro-kernels for the packed GEMM (plain C++, auto-vectorised at the baseline ISA):
// the fallback for CPUs without AVX2/FMA and the path the generic kernel cap forces.
// Same packed layout and contracts as gemm_avx2.cpp (see gemm_kernels.h).
#include <cstdint>
#include <cstring>

#include "host/gemm_kernels.h"

namespace kvr::cpu::detail {
namespace {

// c (MR, 16) (+)= a (kc, 6)[:, :MR] · b (kc, 16); see TileFn. Done as two 8-column halves so
// the MR x 8 accumulators fit the 16 registers of baseline SSE once the compiler vectorises the
// column loop (the A slice is read twice, from L1).
template <int MR>
void tile_generic(size_t kc, const float* a, const float* b, float* c, size_t ldc, bool load_c) {
  for (int h = 0; h < 2; ++h) {
    const float* bh = b + 8 * h;
    float acc[MR][8] = {};
    for (size_t t = 0; t < kc; ++t) {
      const float* bt = bh + t * 16;
      const float* at = a + t * kTileRows;
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) {
        const float av = at[r];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) acc[r][j] += av * bt[j];
      }
    }
    for (int r = 0; r < MR; ++r) {
      float* row = c + r * ldc + 8 * h;
      for (int j = 0; j < 8; ++j) row[j] = load_c ? row[j] + acc[r][j] : acc[r][j];
    }
  }
}

// Four floats as one value (GCC/Clang vector extension: SSE on x86-64, plain scalar code where
// the target has no vectors). Used where the auto-vectoriser picks a poor loop to vectorise.
typedef float V4 __attribute__((vector_size(16)));

inline V4 load4(const float* p) {
  V4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Four bf16 bit patterns widened exactly (<< 16) to the f32 values they encode.
inline V4 load4(const uint16_t* p) {
  uint32_t u[4];
  for (int i = 0; i < 4; ++i) u[i] = static_cast<uint32_t>(p[i]) << 16;
  V4 v;
  std::memcpy(&v, u, sizeof(v));
  return v;
}

// See GemvFn / GemvBf16Fn: one accumulator per output, summed over kc in order (as tile_generic
// does); bf16 panels are widened before the multiply, so both element types give the same bits.
template <typename T>
void gemv_generic(size_t kc, const float* x, const T* b, size_t panel_stride, size_t n_panels,
                  float* y, bool load_y) {
  for (size_t q = 0; q < n_panels; ++q) {
    const T* bq = b + q * panel_stride;
    V4 acc[4] = {};
    for (size_t t = 0; t < kc; ++t) {
      const float xs = x[t];
      const V4 xv = {xs, xs, xs, xs};
      for (int v = 0; v < 4; ++v) acc[v] += xv * load4(bq + t * 16 + 4 * v);
    }
    float out[16];
    std::memcpy(out, acc, sizeof(out));
    float* yq = y + q * 16;
    for (int j = 0; j < 16; ++j) yq[j] = load_y ? yq[j] + out[j] : out[j];
  }
}

// See WidenBf16Fn.
void widen_bf16_generic(size_t count, const uint16_t* src, float* dst) {
  for (size_t i = 0; i < count; ++i) {
    const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &u, sizeof(u));
  }
}

}  // namespace

const KernelTable& generic_kernels() {
  static const KernelTable table = {
      "generic",
      {nullptr, &tile_generic<1>, &tile_generic<2>, &tile_generic<3>, &tile_generic<4>,
       &tile_generic<5>, &tile_generic<6>},
      {},  // no direct bf16 tiles: the driver widens bf16 panel slices for tile_generic
      &gemv_generic<float>,
      &gemv_generic<uint16_t>,
      &widen_bf16_generic,
      {},  // no tall tiles: A in 6-row micro-panels
      {},
      nullptr};
  return table;
}

}  // namespace kvr::cpu::detail
