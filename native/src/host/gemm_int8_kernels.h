// Internal interface between the int8 GEMM driver (gemm_int8.cpp) and its tile kernels
// (gemm_int8_avx512.cpp: AVX-512 VNNI zmm, gemm_int8_avxvnni.cpp: AVX-VNNI ymm). Not the
// driver, not the library's API. A tile multiplies up to max_rows quantized activation rows by
// one or two weight panels over all k blocks and writes the per-output sums to a small buffer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvr::cpu::int8::detail {

// Quantized activation rows as the tiles read them (layout: gemm_int8.h, QuantRows).
struct XRows {
  const int8_t* codes;  // row r's kq signed codes at codes + r·ld
  size_t ld;            // bytes between rows (kq)
  const float* dx;      // row r's block scales at dx + r·ldd
  const float* dxs;     // q4: dx·Σq per block (same stride); null for q8
  const int32_t* xoff;  // q8: −128·Σq per block (same stride); null for q4
  size_t ldd;           // entries between rows (blocks)
};

// Width of one tile's accumulator row: two panels of 16 columns.
constexpr size_t kTileCols = 32;

// acc (rows, kTileCols) = x rows [0, rows) · panels [0, np) (np = 1 or 2), columns 16·np valid.
// The first panel's data start at codes / scale (q8) or codes / scale / mins (q4); the second
// follows at the format's panel stride (q8: blocks·512 codes, blocks·16 bf16 scales; q4:
// blocks·256 code bytes, blocks·16 halves). Per output, per block, the exact int32 dot, then the
// GEMV's f32 epilogue in block order (gemm_q8.h / gemm_q4.h): the same bits as the GEMV.
using TileQ8Fn = void (*)(size_t rows, size_t np, size_t blocks, const XRows& x, const uint8_t* codes,
                          const uint16_t* scale, float* acc);
using TileQ4Fn = void (*)(size_t rows, size_t np, size_t blocks, const XRows& x, const uint8_t* codes,
                          const uint16_t* scale, const uint16_t* mins, float* acc);

struct TileKernels {
  const char* name;
  size_t q8_rows;  // most rows per q8 tile call
  size_t q4_rows;  // most rows per q4 tile call
  TileQ8Fn q8;
  TileQ4Fn q4;
};

// Only valid to call when cpu_features.h says use_avx512_vnni().
const TileKernels& avx512_vnni_tiles();
// Only valid to call when cpu_features.h says use_avx_vnni().
const TileKernels& avx_vnni_tiles();

}  // namespace kvr::cpu::int8::detail
