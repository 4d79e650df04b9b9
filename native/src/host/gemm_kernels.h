// Internal interface between the GEMM driver (gemm.cpp) and its micro-kernels
// (gemm_avx2.cpp, gemm_generic.cpp). Not part of the library's API; the driver picks one
// kernel table at runtime and calls it per micro-tile.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvr::cpu::detail {

// Rows per packed A micro-panel (the tile kernels compute up to 6 x 16 outputs per call).
constexpr size_t kTileRows = 6;

// c (mr, 16) with row stride ldc (+)= a · b over kc steps, where mr is the table index (1..6):
//   a: packed rows, (kc, 6) k-major (only the first mr of each 6 are read)
//   b: one weight panel slice, (kc, 16) k-major
// load_c: add to c's contents (else overwrite).
using TileFn = void (*)(size_t kc, const float* a, const float* b, float* c, size_t ldc,
                        bool load_c);

// y (16 * n_panels) (+)= x (kc) · panels, for one input row (decode): panel q's (kc, 16)
// k-major slice starts at b + q * panel_stride. Writes all 16 * n_panels outputs (y must have
// room). Each output is summed in the same order as the tile kernels (one accumulator per
// output over kc, then added to y), so a row's result does not depend on m.
using GemvFn = void (*)(size_t kc, const float* x, const float* b, size_t panel_stride,
                        size_t n_panels, float* y, bool load_y);

// TileFn over a bf16 panel slice b (kc, 16), each element widened exactly (<< 16) in registers:
// the same multiply-adds in the same order as TileFn on the widened slice, so bit-identical.
using TileBf16Fn = void (*)(size_t kc, const float* a, const uint16_t* b, float* c, size_t ldc,
                            bool load_c);

// GemvFn over bf16 panels (b holds bf16 bit patterns): each element widened exactly (<< 16) and
// then the same multiply-adds in the same order as GemvFn, so the result is bit-identical to
// GemvFn over the widened panels.
using GemvBf16Fn = void (*)(size_t kc, const float* x, const uint16_t* b, size_t panel_stride,
                            size_t n_panels, float* y, bool load_y);

// dst (count) = src (count) bf16 bit patterns widened exactly to f32 (bits << 16).
using WidenBf16Fn = void (*)(size_t count, const uint16_t* src, float* dst);

// Rows per "tall" packed A micro-panel: the few-rows GEMMs of the batched step (2–47 rows, A packed
// once per GEMM by gemm_pack_a) use 16-row tiles where the table has them. Why: a bf16 panel slice
// is widened in registers once per tile call, and at 32 rows the 6-row tiles widened it six times
// (five 6-row tiles and a latency-bound 2-row one per panel); a 16-row tile widens it twice and
// keeps 16 FMA chains in flight. Same sums per output (see TileFn), so the same bits.
constexpr size_t kTallRows = 16;

struct KernelTable {
  const char* name;
  TileFn tile[kTileRows + 1];  // tile[mr] for mr = 1..6; tile[0] unused
  // tile_bf16[mr] for mr = 1..6, or all null when the table has none (the driver then widens
  // each bf16 panel slice into an f32 buffer and runs `tile`)
  TileBf16Fn tile_bf16[kTileRows + 1];
  GemvFn gemv;
  GemvBf16Fn gemv_bf16;
  WidenBf16Fn widen_bf16;
  // Tall tiles, or all null when the table has none (A is then packed in 6-row micro-panels):
  // tall[mr] / tall_bf16[mr] for mr = 1..16 are TileFn / TileBf16Fn with a packed (kc, 16) k-major
  // (only the first mr of each 16 are read).
  TileFn tall[kTallRows + 1];
  TileBf16Fn tall_bf16[kTallRows + 1];
  // Packs x rows [0, mc) (mc <= 16), columns [0, kc) (row stride ldx) into one tall micro-panel
  // dst (kc, 16) k-major, rows past mc zero — the same floats as the portable pack_a loop (a copy),
  // by 16×16 register transposes. Null: the driver's loop.
  void (*pack_tall)(const float* x, size_t ldx, size_t mc, size_t kc, float* dst);
};

const KernelTable& generic_kernels();
// Only valid to call kernels from this table when the CPU has AVX2 and FMA.
const KernelTable& avx2_kernels();
// Only valid to call kernels from this table when the CPU has AVX-512F (bit-identical to AVX2's).
const KernelTable& avx512_kernels();

}  // namespace kvr::cpu::detail
