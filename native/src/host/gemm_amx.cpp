// AMX few-row GEMM (see gemm_amx.h): the three-plane bf16 split of the input rows and two tile
// kernels: pairs of 16-row tiles over pairs of 16-column weight panels (4 accumulator tiles, 2
// weight tiles, 2 input tiles: all 8), and one row tile over up to 4 panels (4 accumulators, the 3
// input planes, 1 weight tile). The weight panels are stored (k, 16) k-major for the AVX/GEMV
// kernels; TDPBF16PS wants k pairs interleaved per column, so each 32-deep slice of a panel is
// re-laid into a 1 KiB stack buffer as it is used (one 64-byte load and one permute per pair of k
// rows), amortised over the rows and the three planes. Compiled per function with target
// attributes; called only when cpu_features.h says use_amx_bf16().
#include "host/gemm_amx.h"

#include <algorithm>
#include <cstring>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define KVR_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx2,fma")))
#define KVR_HAVE_AMX 1
#else
#define KVR_HAVE_AMX 0
#endif

namespace kvr::cpu::amx {

namespace {
constexpr size_t kRowsPerTile = 16;
constexpr size_t kDepth = 32;  // bf16 elements of k per tile row (64 bytes)
constexpr size_t kPlanes = 3;
size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }
}  // namespace

#if KVR_HAVE_AMX
namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The upper 16 bits of each f32 lane: the bf16 of a value whose lower bits are zero.
// (maskz forms: GCC 12's plain ones pass an undefined vector that -Wmaybe-uninitialized rejects)
KVR_AMX_TARGET inline __m256i bits(__m512 f) {
  return _mm512_maskz_cvtepi32_epi16(0xffff, _mm512_maskz_srli_epi32(0xffff, _mm512_castps_si512(f), 16));
}

// Row x[0..k) into the three planes' rows (zero past k up to kp): hi = x truncated to bf16,
// mid = (x − hi) truncated, lo = (x − hi − mid) truncated; both differences are exact in f32
// (they only drop leading bits), so hi + mid + lo = x for normal bf16 values.
KVR_AMX_TARGET void split_row(const float* x, size_t k, size_t kp, uint16_t* hi, uint16_t* mid, uint16_t* lo) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (size_t i = 0; i < kp; i += 16) {
    const __mmask16 valid = i + 16 <= k ? __mmask16(0xffff) : i < k ? __mmask16((1u << (k - i)) - 1) : __mmask16(0);
    const __m512 v = _mm512_maskz_loadu_ps(valid, x + i);
    const __m512 h = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), top));
    const __m512 r = _mm512_sub_ps(v, h);
    const __m512 m = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r), top));
    const __m512 l = _mm512_sub_ps(r, m);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + i), bits(h));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mid + i), bits(m));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + i), bits(l));
  }
}

// Panel rows [k0, k0 + 32) of a (k, 16) k-major bf16 panel as the TDPBF16PS weight tile:
// 16 rows of (w[k0+2r][c], w[k0+2r+1][c]) for c = 0..15; rows past k are zero.
KVR_AMX_TARGET void pair_rows(const uint16_t* panel, size_t k, size_t k0, uint16_t* dst) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                              21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (size_t r = 0; r < kDepth / 2; ++r) {
    // Rows ka and ka + 1 are adjacent in the panel: one 64-byte load (masked past k).
    const size_t ka = k0 + 2 * r;
    const __mmask32 valid = ka + 1 < k ? ~__mmask32(0) : ka < k ? __mmask32(0xffff) : __mmask32(0);
    const __m512i ab = _mm512_maskz_loadu_epi16(valid, panel + ka * 16);
    _mm512_store_si512(dst + r * 32, _mm512_maskz_permutexvar_epi16(~__mmask32(0), interleave, ab));
  }
}

// An accumulator tile's rows [0, rows) × columns [0, cols) of y: loaded (accumulate) or zeroed
// before, stored after; a partial tile goes through `tmp` (16 × 16 floats).
struct Block {
  float* y;
  size_t ldy, rows, cols;
  bool full() const { return rows == kRowsPerTile && cols == 16; }
};
void to_tmp(const Block& b, float* tmp) {
  std::memset(tmp, 0, kRowsPerTile * 16 * sizeof(float));
  for (size_t r = 0; r < b.rows; ++r) std::memcpy(tmp + r * 16, b.y + r * b.ldy, b.cols * sizeof(float));
}
void from_tmp(const Block& b, const float* tmp) {
  for (size_t r = 0; r < b.rows; ++r) std::memcpy(b.y + r * b.ldy, tmp + r * 16, b.cols * sizeof(float));
}

// Tile numbers are immediates of the instructions, hence the macro per accumulator tile.
#define KVR_AMX_LOAD_C(T, blk, tmp)                                              \
  do {                                                                           \
    if (!accumulate) {                                                           \
      _tile_zero(T);                                                             \
    } else if ((blk).full()) {                                                   \
      _tile_loadd(T, (blk).y, static_cast<int>((blk).ldy * sizeof(float)));      \
    } else {                                                                     \
      to_tmp(blk, tmp);                                                          \
      _tile_loadd(T, tmp, 64);                                                   \
    }                                                                            \
  } while (0)
#define KVR_AMX_STORE_C(T, blk, tmp)                                             \
  do {                                                                           \
    if ((blk).full()) {                                                          \
      _tile_stored(T, (blk).y, static_cast<int>((blk).ldy * sizeof(float)));     \
    } else {                                                                     \
      _tile_stored(T, tmp, 64);                                                  \
      from_tmp(blk, tmp);                                                        \
    }                                                                            \
  } while (0)

// Two row tiles. Accumulators: tile 0 (rows r0.., panel p), 1 (r0.., p+1), 2 (r0+16.., p), 3
// (r0+16.., p+1); weights 4 (p), 5 (p+1); input planes 6 (r0..), 7 (r0+16..). w0/w1: the (k, 16)
// panels; each 32-deep slice is laid out by pair_rows into a stack buffer just before its tile
// load. (Laying a panel pair's whole k out once per block of rows instead measured 40 % slower on
// a 16-row tiny-powerful step, 1.24 → 1.75 ms, and no faster on prefill: it was reverted.)
template <bool kTwoPanels>
KVR_AMX_TARGET void tile_block(const uint16_t* planes, size_t plane_stride, size_t kp, size_t k, const uint16_t* w0,
                               const uint16_t* w1, Block c0, Block c1, Block c2, Block c3, bool accumulate) {
  alignas(64) float tmp[kRowsPerTile * 16];
  alignas(64) uint16_t lay0[kDepth * 16], lay1[kDepth * 16];
  KVR_AMX_LOAD_C(0, c0, tmp);
  if constexpr (kTwoPanels) KVR_AMX_LOAD_C(1, c1, tmp);
  KVR_AMX_LOAD_C(2, c2, tmp);
  if constexpr (kTwoPanels) KVR_AMX_LOAD_C(3, c3, tmp);
  const int stride = static_cast<int>(kp * sizeof(uint16_t));
  for (size_t k0 = 0; k0 < kp; k0 += kDepth) {
    pair_rows(w0, k, k0, lay0);
    _tile_loadd(4, lay0, 64);
    if constexpr (kTwoPanels) {
      pair_rows(w1, k, k0, lay1);
      _tile_loadd(5, lay1, 64);
    }
    for (size_t t = 0; t < kPlanes; ++t) {
      const uint16_t* a = planes + t * plane_stride + k0;
      _tile_loadd(6, a, stride);
      _tile_dpbf16ps(0, 6, 4);
      if constexpr (kTwoPanels) _tile_dpbf16ps(1, 6, 5);
      _tile_loadd(7, a + kRowsPerTile * kp, stride);
      _tile_dpbf16ps(2, 7, 4);
      if constexpr (kTwoPanels) _tile_dpbf16ps(3, 7, 5);
    }
  }
  KVR_AMX_STORE_C(0, c0, tmp);
  if constexpr (kTwoPanels) KVR_AMX_STORE_C(1, c1, tmp);
  KVR_AMX_STORE_C(2, c2, tmp);
  if constexpr (kTwoPanels) KVR_AMX_STORE_C(3, c3, tmp);
}

// One row tile (≤ 16 rows: a thread's group in the batched step, or the odd last row tile of
// more rows) over kPanels ≤ 4 panels.
// Accumulators: tiles 0..kPanels-1 (panels w[0..kPanels)); the three input planes of the current
// 32-deep slice sit in tiles 4, 5, 6 and each panel's slice passes through tile 7. A tile load
// of a buffer just written by 16 vector stores waits for them to retire, which left the tile
// unit idle most of the time (~40–65 cycles per TDPBF16PS, 16 is its rate); so the pair_rows of
// the NEXT (slice, panel) step goes into the other of two buffers before this step's tile load
// and TDPs, and those stores retire while the tile unit works. Each accumulator still gets the
// same TDPBF16PS sequence as tile_block's (slice by slice, planes hi, mid, lo), so the result is
// the same bits. (Laying all weights out once, in a second copy, measured faster still in a
// microbenchmark but doubles the bf16 weight memory: not done.)
template <size_t kPanels>
KVR_AMX_TARGET void row_tile(const uint16_t* planes, size_t plane_stride, size_t kp, size_t k,
                             const uint16_t* const* w, const Block* c, bool accumulate) {
  static_assert(kPanels >= 1 && kPanels <= 4, "tiles 0-3 are the accumulators");
  alignas(64) float tmp[kRowsPerTile * 16];
  alignas(64) uint16_t lay[2][kDepth * 16];
  KVR_AMX_LOAD_C(0, c[0], tmp);
  if constexpr (kPanels > 1) KVR_AMX_LOAD_C(1, c[1], tmp);
  if constexpr (kPanels > 2) KVR_AMX_LOAD_C(2, c[2], tmp);
  if constexpr (kPanels > 3) KVR_AMX_LOAD_C(3, c[3], tmp);
  const int stride = static_cast<int>(kp * sizeof(uint16_t));
  size_t cur = 0;
  pair_rows(w[0], k, 0, lay[0]);
  for (size_t k0 = 0; k0 < kp; k0 += kDepth) {
    _tile_loadd(4, planes + k0, stride);
    _tile_loadd(5, planes + plane_stride + k0, stride);
    _tile_loadd(6, planes + 2 * plane_stride + k0, stride);
    // Panel i of this slice: lay out the next step (panel i + 1, or panel 0 of the next slice),
    // then load and multiply this one. Tile numbers are immediates, hence the macro.
#define KVR_AMX_STEP(i)                                                                  \
  do {                                                                                   \
    if constexpr ((i) + 1 < kPanels) {                                                   \
      pair_rows(w[(i) + 1], k, k0, lay[cur ^ 1]);                                        \
    } else if (k0 + kDepth < kp) {                                                       \
      pair_rows(w[0], k, k0 + kDepth, lay[cur ^ 1]);                                     \
    }                                                                                    \
    _tile_loadd(7, lay[cur], 64);                                                        \
    _tile_dpbf16ps(i, 4, 7);                                                             \
    _tile_dpbf16ps(i, 5, 7);                                                             \
    _tile_dpbf16ps(i, 6, 7);                                                             \
    cur ^= 1;                                                                            \
  } while (0)
    KVR_AMX_STEP(0);
    if constexpr (kPanels > 1) KVR_AMX_STEP(1);
    if constexpr (kPanels > 2) KVR_AMX_STEP(2);
    if constexpr (kPanels > 3) KVR_AMX_STEP(3);
#undef KVR_AMX_STEP
  }
  KVR_AMX_STORE_C(0, c[0], tmp);
  if constexpr (kPanels > 1) KVR_AMX_STORE_C(1, c[1], tmp);
  if constexpr (kPanels > 2) KVR_AMX_STORE_C(2, c[2], tmp);
  if constexpr (kPanels > 3) KVR_AMX_STORE_C(3, c[3], tmp);
}
#undef KVR_AMX_LOAD_C
#undef KVR_AMX_STORE_C

// Every tile 16 rows of 64 bytes. A constant in memory: GCC 12 dropped the stores of a local
// config filled before ldtilecfg (its asm reads the operand as a __m512), leaving palette 1 with
// no tiles configured, and the first tile instruction raised SIGILL.
constexpr TileConfig all_tiles_16x64() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = kRowsPerTile;
    cfg.colsb[t] = 64;
  }
  return cfg;
}
constexpr TileConfig kTileConfig = all_tiles_16x64();

KVR_AMX_TARGET void load_config() { _tile_loadconfig(&kTileConfig); }

KVR_AMX_TARGET void release() { _tile_release(); }

}  // namespace
#endif

void SplitRows::prepare(const float* x, size_t m, size_t ldx, size_t k) {
  m_ = m;
  k_ = k;
  mp_ = round_up(std::max<size_t>(m, 1), kRowsPerTile);
  kp_ = round_up(std::max<size_t>(k, 1), kDepth);
  const size_t plane = mp_ * kp_;
  if (planes_.size() < kPlanes * plane) planes_.resize(kPlanes * plane);
  for (size_t t = 0; t < kPlanes; ++t) {  // zero rows [m, mp_): they pad the last row tile
    std::fill(planes_.begin() + static_cast<std::ptrdiff_t>(t * plane + m * kp_),
              planes_.begin() + static_cast<std::ptrdiff_t>((t + 1) * plane), 0);
  }
#if KVR_HAVE_AMX
  for (size_t r = 0; r < m; ++r) {
    uint16_t* hi = planes_.data() + r * kp_;
    split_row(x + r * ldx, k, kp_, hi, hi + plane, hi + 2 * plane);
  }
#else
  (void)x;
  (void)ldx;
#endif
}

void SplitRows::gemm_range(const PackedWeight& w, float* y, size_t ldy, bool accumulate, size_t p0,
                           size_t p1) const {
#if KVR_HAVE_AMX
  p1 = std::min(p1, w.panels());
  if (m_ == 0 || p0 >= p1) return;
  const size_t n = w.rows(), plane = mp_ * kp_;
  load_config();
  for (size_t r0 = 0; r0 < m_; r0 += 2 * kRowsPerTile) {
    const bool two_rows = r0 + kRowsPerTile < m_;
    const size_t rows_a = std::min(kRowsPerTile, m_ - r0);
    const uint16_t* a = planes_.data() + r0 * kp_;
    float* yr = y + r0 * ldy;
    if (!two_rows) {
      // One row tile: 2 panels at a time, 4 from k 512 on. (4 measured slower at small k with wide
      // outputs — 16-row lm_head 4096 × 128: 47 → 71 µs — and faster at k 512: 213 → 194 µs.)
      const size_t group = kp_ >= 512 ? 4 : 2;
      for (size_t p = p0; p < p1; p += group) {
        const size_t count = std::min<size_t>(group, p1 - p);
        const uint16_t* wp[4] = {};
        Block c[4] = {};
        for (size_t i = 0; i < count; ++i) {
          wp[i] = w.panel_bf16(p + i);
          c[i] = Block{yr + (p + i) * 16, ldy, rows_a, std::min<size_t>(16, n - (p + i) * 16)};
        }
        switch (count) {
          case 4: row_tile<4>(a, plane, kp_, k_, wp, c, accumulate); break;
          case 3: row_tile<3>(a, plane, kp_, k_, wp, c, accumulate); break;
          case 2: row_tile<2>(a, plane, kp_, k_, wp, c, accumulate); break;
          default: row_tile<1>(a, plane, kp_, k_, wp, c, accumulate); break;
        }
      }
      continue;
    }
    const size_t rows_b = std::min(kRowsPerTile, m_ - r0 - kRowsPerTile);
    for (size_t p = p0; p < p1; p += 2) {
      const bool two_panels = p + 1 < p1;
      const size_t cols_a = std::min<size_t>(16, n - p * 16);
      const size_t cols_b = two_panels ? std::min<size_t>(16, n - (p + 1) * 16) : 0;
      float* ya = yr + p * 16;
      const Block c0{ya, ldy, rows_a, cols_a}, c1{ya + 16, ldy, rows_a, cols_b};
      const Block c2{ya + kRowsPerTile * ldy, ldy, rows_b, cols_a}, c3{ya + kRowsPerTile * ldy + 16, ldy, rows_b, cols_b};
      const uint16_t* w0 = w.panel_bf16(p);
      const uint16_t* w1 = two_panels ? w.panel_bf16(p + 1) : nullptr;
      if (two_panels) {
        tile_block<true>(a, plane, kp_, k_, w0, w1, c0, c1, c2, c3, accumulate);
      } else {
        tile_block<false>(a, plane, kp_, k_, w0, w1, c0, c1, c2, c3, accumulate);
      }
    }
  }
  release();
#else
  (void)w;
  (void)y;
  (void)ldy;
  (void)accumulate;
  (void)p0;
  (void)p1;
#endif
}

}  // namespace kvr::cpu::amx
