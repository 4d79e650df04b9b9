// Packed single-precision GEMM y (m, n) = x (m, k) · Wᵀ (W packed as f32 or bf16): weight packing,
// cache blocking, bf16 panel widening, work split (OpenMP, or for m > 1 the caller's choice of
// OpenMP or the worker pool: parallel_for.h) and runtime kernel dispatch (AVX2+FMA or portable).
// The micro-kernels themselves live in gemm_avx2.cpp / gemm_generic.cpp; this file has no
// ISA-specific code.
// Layout, blocking and measured numbers: docs/gemm.md.
#include "host/gemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "host/cpu_features.h"
#include "host/gemm_amx.h"
#include "host/gemm_int8.h"
#include "host/gemm_kernels.h"
#include "host/gemm_q4.h"
#include "host/gemm_q8.h"
#include "host/parallel_for.h"

namespace kvr::cpu {

namespace {

float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

using detail::KernelTable;
using detail::kTileRows;

// Cache blocking (floats). A block (MC, KC) packed ≈ 96 KiB sits in L2; one weight panel slice
// (KC, 16) = 16 KiB stays in L1 while the MC/6 tiles of the A block stream past it.
#ifndef KVR_GEMM_KC
#define KVR_GEMM_KC 256
#endif
#ifndef KVR_GEMM_MC
#define KVR_GEMM_MC 96
#endif
constexpr size_t kKC = KVR_GEMM_KC;
constexpr size_t kMC = KVR_GEMM_MC;  // multiple of kTileRows
static_assert(kMC % kTileRows == 0 && kMC % detail::kTallRows == 0, "MC must be a multiple of the tile heights");
// Below this many multiply-adds a call runs on one thread (team start-up would dominate).
constexpr size_t kMinParallelMacs = size_t{1} << 17;
// Largest A (floats) packed whole for the few-rows split (16 MiB); larger goes by row blocks.
constexpr size_t kMaxWholeA = size_t{1} << 22;

const KernelTable& choose_kernels() {
  // The CPU's features under the current KernelCap: cpu_features.h (the one dispatch)
  if (use_avx512_gemm()) return detail::avx512_kernels();
  return use_avx2_gemm() ? detail::avx2_kernels() : detail::generic_kernels();
}

// Chosen once per process for each cap (thread-safe function-local static); the calling thread's
// cap picks one.
const KernelTable& kernels() {
  static const auto tables = per_cap([] { return &choose_kernels(); });
  return *tables[cap_index()];
}

// Per-thread scratch for packed A blocks, reused across calls: (MC/6, KC, 6) floats.
float* a_scratch() {
  thread_local std::vector<float, AlignedAllocator<float>> buf;
  if (buf.size() < kMC * kKC) buf.resize(kMC * kKC);
  return buf.data();
}

// Packs x rows [0, mc) and columns [0, kc) (row stride ldx) into (ceil(mc/g), kc, g) k-major
// micro-panels of g rows (6, or kTallRows for the tall tiles); rows past mc are zero.
void pack_a(const float* x, size_t ldx, size_t mc, size_t kc, float* dst, size_t g_rows = kTileRows) {
  const auto pack_tall = kernels().pack_tall;
  if (g_rows == detail::kTallRows && pack_tall != nullptr) {  // the same floats, transposed in registers
    for (size_t g = 0; g < mc; g += g_rows) pack_tall(x + g * ldx, ldx, std::min(g_rows, mc - g), kc, dst + g * kc);
    return;
  }
  for (size_t g = 0; g < mc; g += g_rows) {
    float* panel = dst + g * kc;
    const size_t rows = std::min(g_rows, mc - g);
    for (size_t r = 0; r < g_rows; ++r) {
      if (r < rows) {
        const float* src = x + (g + r) * ldx;
        for (size_t t = 0; t < kc; ++t) panel[t * g_rows + r] = src[t];
      } else {
        for (size_t t = 0; t < kc; ++t) panel[t * g_rows + r] = 0.f;
      }
    }
  }
}

// The tile kernel for mr rows over f32 or bf16 panel slices (tall: A in kTallRows micro-panels).
inline detail::TileFn tile(const KernelTable& kt, size_t mr, const float*, bool tall) {
  return tall ? kt.tall[mr] : kt.tile[mr];
}
inline detail::TileBf16Fn tile(const KernelTable& kt, size_t mr, const uint16_t*, bool tall) {
  return tall ? kt.tall_bf16[mr] : kt.tile_bf16[mr];
}

// Rows of the A micro-panels gemm_pack_a writes: the tall tiles' when the table has them.
size_t packed_group(const KernelTable& kt) { return kt.tall[1] != nullptr ? detail::kTallRows : kTileRows; }

// y rows [0, mc) x columns of panel slice bp (kc, 16) (+)= packed A rows · bp, tile by tile.
// a: first packed tile of the rows, a_stride floats between tiles (A tiles are (kc', g) with
// kc' >= kc and g = 6, or kTallRows when tall; the slice for this k block starts at a). ncol <= 16
// valid columns at y. bp is f32, or bf16 when the table has direct bf16 tiles.
template <typename T>
void run_tiles(const KernelTable& kt, const float* a, size_t a_stride, size_t mc, size_t kc,
               const T* bp, float* y, size_t ldy, size_t ncol, bool load, bool tall = false) {
  const size_t g = tall ? detail::kTallRows : kTileRows;
  alignas(64) float tmp[detail::kTallRows * kPanelWidth];
  for (size_t ir = 0; ir < mc; ir += g) {
    const size_t mr = std::min(g, mc - ir);
    const float* at = a + (ir / g) * a_stride;
    float* cp = y + ir * ldy;
    if (ncol == kPanelWidth) {
      tile(kt, mr, bp, tall)(kc, at, bp, cp, ldy, load);
    } else {
      // Column tail: compute the full 16-wide tile into tmp, copy the valid columns.
      if (load) {
        for (size_t r = 0; r < mr; ++r) {
          std::memcpy(tmp + r * kPanelWidth, cp + r * ldy, ncol * sizeof(float));
        }
      }
      tile(kt, mr, bp, tall)(kc, at, bp, tmp, kPanelWidth, load);
      for (size_t r = 0; r < mr; ++r) {
        std::memcpy(cp + r * ldy, tmp + r * kPanelWidth, ncol * sizeof(float));
      }
    }
  }
}

// The (kc, 16) slice of panel p starting at k offset pc, as f32: f32 weights are read in place;
// bf16 weights are widened exactly into buf (kKC * 16 floats) first, once per slice, so the f32
// tile kernels then run unchanged (same operands, same bits), the widening amortised over the
// rows of the block. Used for bf16 only when the kernel table has no direct bf16 tiles (generic);
// the AVX2 tiles widen in registers instead (see docs/gemm.md "bf16 weights").
const float* panel_slice(const KernelTable& kt, const PackedWeight& w, size_t p, size_t pc,
                         size_t kc, float* buf) {
  if (w.is_q8()) {  // q8: dequantized once per slice (pc is a multiple of KC, so of 32)
    q8::dequant_slice(w, p, pc, kc, buf);
    return buf;
  }
  if (w.is_q4()) {  // q4: likewise
    q4::dequant_slice(w, p, pc, kc, buf);
    return buf;
  }
  if (!w.is_bf16()) return w.panel(p) + pc * kPanelWidth;
  kt.widen_bf16(kc * kPanelWidth, w.panel_bf16(p) + pc * kPanelWidth, buf);
  return buf;
}

// Rows [m0, m1) of y against weight panels [p0, p1) (default: every panel): A packed block by
// block (MC, KC) into this thread's scratch (L2), each (KC, 16) weight panel slice reused across
// the block's tiles (L1).
void gemm_rows(const KernelTable& kt, const float* x, size_t ldx, const PackedWeight& w, float* y,
               size_t ldy, bool accumulate, size_t m0, size_t m1, size_t p0 = 0,
               size_t p1 = SIZE_MAX) {
  const size_t n = w.rows(), k = w.cols(), panels = std::min(p1, w.panels()), g = packed_group(kt);
  const bool tall = g != kTileRows;  // kMC is a multiple of both row groups
  float* apack = a_scratch();
  const bool direct_bf16 = w.is_bf16() && kt.tile_bf16[1] != nullptr;
  alignas(64) float bbuf[kKC * kPanelWidth];  // widened bf16 panel slice (16 KiB)
  for (size_t pc = 0; pc < k; pc += kKC) {
    const size_t kc = std::min(kKC, k - pc);
    const bool load = accumulate || pc > 0;
    for (size_t ic = m0; ic < m1; ic += kMC) {
      const size_t mc = std::min(kMC, m1 - ic);
      pack_a(x + ic * ldx + pc, ldx, mc, kc, apack, g);
      for (size_t p = p0; p < panels; ++p) {
        const size_t col = p * kPanelWidth, ncol = std::min(kPanelWidth, n - col);
        if (direct_bf16) {
          run_tiles(kt, apack, kc * g, mc, kc, w.panel_bf16(p) + pc * kPanelWidth, y + ic * ldy + col,
                    ldy, ncol, load, tall);
        } else {
          run_tiles(kt, apack, kc * g, mc, kc, panel_slice(kt, w, p, pc, kc, bbuf), y + ic * ldy + col,
                    ldy, ncol, load, tall);
        }
      }
    }
  }
}

// All m rows of y against weight panels [p0, p1), with A already packed whole: apack is
// (ceil(m/g), k, g) (pack_a over all of k, g = packed_group(kt)). Used for small m, where the
// work splits over panels.
void gemm_panels(const KernelTable& kt, const float* apack, size_t m, const PackedWeight& w,
                 float* y, size_t ldy, bool accumulate, size_t p0, size_t p1) {
  const size_t n = w.rows(), k = w.cols(), g = packed_group(kt);
  const bool tall = g != kTileRows;
  const bool direct_bf16 = w.is_bf16() && kt.tile_bf16[1] != nullptr;
  alignas(64) float bbuf[kKC * kPanelWidth];  // widened bf16 panel slice (16 KiB)
  for (size_t pc = 0; pc < k; pc += kKC) {
    const size_t kc = std::min(kKC, k - pc);
    const bool load = accumulate || pc > 0;
    for (size_t p = p0; p < p1; ++p) {
      const size_t col = p * kPanelWidth, ncol = std::min(kPanelWidth, n - col);
      if (direct_bf16) {
        run_tiles(kt, apack + pc * g, k * g, m, kc, w.panel_bf16(p) + pc * kPanelWidth, y + col,
                  ldy, ncol, load, tall);
      } else {
        run_tiles(kt, apack + pc * g, k * g, m, kc, panel_slice(kt, w, p, pc, kc, bbuf), y + col,
                  ldy, ncol, load, tall);
      }
    }
  }
}

// One row (decode) against weight panels [p0, p1) of y (n); x is read in place, bf16 panels are
// read directly (widened in registers). Blocked over k like gemm_rows so each output is summed in
// the same order as on the tile path.
void gemv_panels(const KernelTable& kt, const float* x, const PackedWeight& w, float* y,
                 bool accumulate, size_t p0, size_t p1) {
  const size_t n = w.rows(), k = w.cols();
  if (w.is_q8()) {  // x quantized per 32-block (as llama.cpp's q8_0 dot), integer dot products
    thread_local std::vector<int8_t> xq;
    thread_local std::vector<float> dx;
    thread_local std::vector<int32_t> xoff;
    const size_t blocks = w.q8_blocks();
    if (xq.size() < blocks * PackedWeight::kQ8Block) xq.resize(blocks * PackedWeight::kQ8Block);
    if (dx.size() < blocks) dx.resize(blocks), xoff.resize(blocks);
    q8::quantize_x(x, k, blocks, xq.data(), dx.data(), xoff.data());
    for (size_t b = 0; b < blocks; ++b) xoff[b] *= -128;  // undoes the weights' +128, per block
    q8::gemv(w, xq.data(), dx.data(), xoff.data(), p0, p1, y, accumulate);
    return;
  }
  if (w.is_q4()) {  // the same activation quantizer, plus dx·Σcode per block
    thread_local std::vector<int8_t> xs;
    thread_local std::vector<float> dx, dxs;
    thread_local std::vector<int32_t> sx;
    const size_t blocks = w.q8_blocks(), kq = blocks * PackedWeight::kQ8Block;
    if (xs.size() < kq) xs.resize(kq);
    if (dx.size() < blocks) dx.resize(blocks), dxs.resize(blocks), sx.resize(blocks);
    q8::quantize_x(x, k, blocks, xs.data(), dx.data(), sx.data());
    for (size_t b = 0; b < blocks; ++b) dxs[b] = dx[b] * static_cast<float>(sx[b]);
    q4::gemv(w, xs.data(), dx.data(), dxs.data(), p0, p1, y, accumulate);
    return;
  }
  const size_t stride = k * kPanelWidth;
  const size_t full_end = std::max(p0, std::min(p1, n / kPanelWidth));  // all 16 columns valid
  alignas(64) float tmp[kPanelWidth];
  const size_t col = full_end * kPanelWidth;  // the partial last panel, if in range
  const bool tail = p1 > full_end;
  if (tail && accumulate) std::memcpy(tmp, y + col, (n - col) * sizeof(float));
  for (size_t pc = 0; pc < k; pc += kKC) {
    const size_t kc = std::min(kKC, k - pc);
    const bool load = accumulate || pc > 0;
    const size_t off = pc * kPanelWidth;
    if (full_end > p0) {
      if (w.is_bf16()) {
        kt.gemv_bf16(kc, x + pc, w.panel_bf16(p0) + off, stride, full_end - p0,
                     y + p0 * kPanelWidth, load);
      } else {
        kt.gemv(kc, x + pc, w.panel(p0) + off, stride, full_end - p0, y + p0 * kPanelWidth, load);
      }
    }
    if (tail) {
      if (w.is_bf16()) {
        kt.gemv_bf16(kc, x + pc, w.panel_bf16(full_end) + off, stride, 1, tmp, load);
      } else {
        kt.gemv(kc, x + pc, w.panel(full_end) + off, stride, 1, tmp, load);
      }
    }
  }
  if (tail) std::memcpy(y + col, tmp, (n - col) * sizeof(float));
}

// Number of work units to cut `units` (tiles or panels) into for nt threads: about 4 per thread
// (dynamic scheduling absorbs a thread the OS delays), each at most max_per_task units, rounded
// up to a multiple of nt so equal shares end together; never more than units.
size_t task_count(size_t units, size_t nt, size_t max_per_task) {
  size_t tasks = std::max((units + max_per_task - 1) / max_per_task, 4 * nt);
  tasks = (tasks + nt - 1) / nt * nt;
  return std::min(tasks, units);
}

// Splits [0, count) into `parts` near-equal ranges; range i is [*begin, *end).
void split_range(size_t count, size_t parts, size_t i, size_t* begin, size_t* end) {
  const size_t base = count / parts, extra = count % parts;
  *begin = i * base + std::min(i, extra);
  *end = *begin + base + (i < extra ? 1 : 0);
}

}  // namespace

namespace {

// Packs w (n, k) row-major into ceil(n/16) (k, 16) k-major panels at dst; columns past n zero.
template <typename T>
void pack_panels(const T* w, size_t n, size_t k, T* dst) {
  const size_t panels = (n + kPanelWidth - 1) / kPanelWidth;
  for (size_t pi = 0; pi < panels; ++pi) {
    T* panel = dst + pi * k * kPanelWidth;
    for (size_t c = 0; c < kPanelWidth; ++c) {
      const size_t row = pi * kPanelWidth + c;
      if (row < n) {
        const T* src = w + row * k;
        for (size_t t = 0; t < k; ++t) panel[t * kPanelWidth + c] = src[t];
      } else {
        for (size_t t = 0; t < k; ++t) panel[t * kPanelWidth + c] = T{0};
      }
    }
  }
}

}  // namespace

PackedWeight PackedWeight::pack(const float* w, size_t n, size_t k) {
  PackedWeight p;
  p.n_ = n;
  p.k_ = k;
  p.data_.resize(p.panels() * k * kPanelWidth);
  pack_panels(w, n, k, p.data_.data());
  return p;
}

namespace {

// d (finite, ≥ 0) rounded up to the next bf16 (its upper 16 bits): quantizing against the
// rounded-up scale keeps every |w|/d ≤ 127, so no code clamps and each error stays ≤ d/2.
uint16_t bf16_round_up(float d) {
  uint32_t u;
  std::memcpy(&u, &d, sizeof u);
  if ((u & 0xFFFFu) != 0) u += 0x10000u;
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

PackedWeight PackedWeight::pack_q8(const float* w, size_t n, size_t k) {
  PackedWeight p;
  p.n_ = n;
  p.k_ = k;
  p.q8_ = true;
  const size_t P = p.panels(), B = p.q8_blocks();
  p.data8_.assign(P * B * 512, 128);  // q = 0 (padding columns and k past the end)
  p.q8_scale_.assign(P * B * 16, 0);
  for (size_t r = 0; r < n; ++r) {
    const size_t pi = r / kPanelWidth, c = r % kPanelWidth;
    const float* src = w + r * k;
    for (size_t b = 0; b < B; ++b) {
      const size_t k0 = b * kQ8Block, k1 = std::min(k, k0 + kQ8Block);
      float amax = 0.f;
      for (size_t i = k0; i < k1; ++i) amax = std::max(amax, std::fabs(src[i]));
      const uint16_t d16 = bf16_round_up(amax / 127.f);
      const float d = bf16_to_f32(d16);
      const float inv = d > 0.f ? 1.f / d : 0.f;
      uint8_t* blk = p.data8_.data() + (pi * B + b) * 512;
      for (size_t i = k0; i < k1; ++i) {
        const int q = std::clamp(static_cast<int>(std::nearbyint(src[i] * inv)), -127, 127);
        const size_t t = i - k0;
        blk[(t / 4) * 64 + c * 4 + t % 4] = static_cast<uint8_t>(q + 128);
      }
      p.q8_scale_[(pi * B + b) * 16 + c] = d16;
    }
  }
  return p;
}

PackedWeight PackedWeight::pack_q4(const float* w, size_t n, size_t k) {
  PackedWeight p;
  p.n_ = n;
  p.k_ = k;
  p.q4_ = true;
  const size_t P = p.panels(), B = p.q8_blocks();
  p.data4_.assign(P * B * 256, 0);
  p.q4_scale_.assign(P * B * 16, 0);
  p.q4_min_.assign(P * B * 16, 0);
  // Rows are independent (a least-squares fit per 32-block): split them over the cores, as the
  // fit costs a few passes per weight at load.
#pragma omp parallel for schedule(static)
  for (long rl = 0; rl < static_cast<long>(n); ++rl) {
    const size_t r = static_cast<size_t>(rl), pi = r / kPanelWidth, c = r % kPanelWidth;
    const float* src = w + r * k;
    for (size_t b = 0; b < B; ++b) {
      const size_t k0 = b * kQ8Block, len = std::min(k, k0 + kQ8Block) - k0;
      uint8_t codes[kQ8Block];
      const size_t mi = (pi * B + b) * 16 + c;
      q4::fit_block(src + k0, len, codes, &p.q4_scale_[mi], &p.q4_min_[mi]);
      uint8_t* blk = p.data4_.data() + (pi * B + b) * 256;
      // A byte holds two k of one row (low and high nibble): threads never share a byte.
      for (size_t t = 0; t < len; ++t) {
        const size_t j = (t % 16) / 4, e = t % 4;
        const uint8_t v = static_cast<uint8_t>(codes[t] << (t < 16 ? 0 : 4));
        blk[j * 64 + c * 4 + e] |= v;
      }
    }
  }
  return p;
}

PackedWeight PackedWeight::pack_bf16(const uint16_t* w, size_t n, size_t k) {
  const Bf16Rows all{w, n};
  return pack_bf16(&all, 1, k);
}

PackedWeight PackedWeight::pack_bf16(const Bf16Rows* parts, size_t n_parts, size_t k) {
  PackedWeight p;
  p.k_ = k;
  p.bf16_ = true;
  const std::vector<Bf16Rows> blocks(parts, parts + n_parts);
  for (const Bf16Rows& b : blocks) p.n_ += b.rows;
  const size_t panels = p.panels();
  p.data16_.resize(panels * k * kPanelWidth);  // not zeroed: every element is written below
  uint16_t* dst = p.data16_.data();
  // Row r's source: the block holding it (a handful of blocks: a linear scan).
  auto source = [&](size_t r) -> const uint8_t* {
    for (const Bf16Rows& b : blocks) {
      if (r < b.rows) return static_cast<const uint8_t*>(b.data) + r * k * sizeof(uint16_t);
      r -= b.rows;
    }
    return nullptr;  // r >= n: a padding column
  };
  constexpr size_t kT = 64;  // k per tile: 16 rows x 64 = 2 KiB in, 2 KiB out
#pragma omp parallel for schedule(static) if (panels > 1)
  for (long pl = 0; pl < static_cast<long>(panels); ++pl) {
    const size_t pi = static_cast<size_t>(pl);
    const uint8_t* src[kPanelWidth];
    for (size_t c = 0; c < kPanelWidth; ++c) src[c] = source(pi * kPanelWidth + c);
    uint16_t* panel = dst + pi * k * kPanelWidth;
    alignas(64) uint16_t tile[kPanelWidth][kT];
    for (size_t t0 = 0; t0 < k; t0 += kT) {
      const size_t len = std::min(kT, k - t0);
      for (size_t c = 0; c < kPanelWidth; ++c) {  // memcpy: the mapped rows may be unaligned
        if (src[c] != nullptr) {
          std::memcpy(tile[c], src[c] + t0 * sizeof(uint16_t), len * sizeof(uint16_t));
        } else {
          std::memset(tile[c], 0, len * sizeof(uint16_t));
        }
      }
      uint16_t* out = panel + t0 * kPanelWidth;
      for (size_t t = 0; t < len; ++t) {
        for (size_t c = 0; c < kPanelWidth; ++c) out[t * kPanelWidth + c] = tile[c][t];
      }
    }
  }
  return p;
}

void PackedWeight::unpack_f32(float* out) const {
  for (size_t r = 0; r < n_; ++r) row_f32(r, out + r * k_);
}

void PackedWeight::row_f32(size_t r, float* out) const {
  const size_t pi = r / kPanelWidth, c = r % kPanelWidth;
  if (bf16_) {
    const uint16_t* s = panel_bf16(pi) + c;
    for (size_t t = 0; t < k_; ++t) {
      const uint32_t u = static_cast<uint32_t>(s[t * kPanelWidth]) << 16;
      std::memcpy(out + t, &u, sizeof(float));
    }
  } else if (q8_ || q4_) {  // one column of the dequantized slices (q8/q4::dequant_slice)
    alignas(64) float buf[kKC * kPanelWidth];
    for (size_t pc = 0; pc < k_; pc += kKC) {
      const size_t kc = std::min(kKC, k_ - pc);
      if (q8_) q8::dequant_slice(*this, pi, pc, kc, buf);
      else q4::dequant_slice(*this, pi, pc, kc, buf);
      for (size_t t = 0; t < kc; ++t) out[pc + t] = buf[t * kPanelWidth + c];
    }
  } else {
    const float* s = panel(pi) + c;
    for (size_t t = 0; t < k_; ++t) out[t] = s[t * kPanelWidth];
  }
}

void matmul_xwt(const float* x, size_t m, size_t ldx, const PackedWeight& w, float* y,
                size_t ldy, bool accumulate, int n_threads, Workers workers) {
  const size_t n = w.rows(), k = w.cols();
  if (m == 0 || n == 0) return;
  if (k == 0) {  // empty sum
    if (!accumulate) {
      for (size_t i = 0; i < m; ++i) std::memset(y + i * ldy, 0, n * sizeof(float));
    }
    return;
  }
  const KernelTable& kt = kernels();
  const size_t panels = w.panels();
  const size_t row_tiles = (m + kTileRows - 1) / kTileRows;
  size_t nt = n_threads > 1 ? static_cast<size_t>(n_threads) : 1;
  size_t mn = 0, macs = 0;  // m*n*k, saturating (only compared with a small threshold)
  if (__builtin_mul_overflow(m, n, &mn) || __builtin_mul_overflow(mn, k, &macs)) macs = SIZE_MAX;
  if (macs < kMinParallelMacs) nt = 1;
  nt = std::min(nt, panels * row_tiles);

  if (m == 1) {  // decode: memory-bound GEMV over panel ranges
    if (nt <= 1) {
      gemv_panels(kt, x, w, y, accumulate, 0, panels);
      return;
    }
    const size_t tasks = task_count(panels, nt, panels);
    const KernelChoice* choice = current_choice_ptr();  // the caller's cap, on every thread
#pragma omp parallel num_threads(static_cast<int>(nt))
    {
      const KernelScope scope(choice);
#pragma omp for schedule(dynamic, 1)
      for (long t = 0; t < static_cast<long>(tasks); ++t) {
        size_t p0, p1;
        split_range(panels, tasks, static_cast<size_t>(t), &p0, &p1);
        gemv_panels(kt, x, w, y, accumulate, p0, p1);
      }
    }
    return;
  }

  if (w.is_q8() || w.is_q4()) {  // int8 activations and integer dots, as the GEMV (gemm_int8.h)
    int8::matmul(x, m, ldx, w, y, ldy, accumulate, nt, workers);
    return;
  }

  if (amx::applies(w, m)) {
    // AMX tiles (gemm_amx.h): row blocks of kBlockRows, split further into one panel range per
    // thread when there are fewer blocks than threads; each task splits its rows itself (so a
    // block's split is repeated per range: fewer ranges measured faster at 128 rows).
    constexpr size_t kAmxRows = amx::kBlockRows;
    const size_t blocks = (m + kAmxRows - 1) / kAmxRows;
    const size_t per_block = blocks >= nt ? 1 : std::min(panels, (nt + blocks - 1) / blocks);
    std::atomic<bool> failed{false};
    parallel_dynamic(workers, static_cast<int>(nt), blocks * per_block, [&](size_t t, unsigned) {
      const size_t b = t / per_block, r0 = b * kAmxRows, r1 = std::min(m, r0 + kAmxRows);
      size_t p0, p1;
      split_range(panels, per_block, t % per_block, &p0, &p1);
      try {
        thread_local amx::SplitRows split;
        split.prepare(x + r0 * ldx, r1 - r0, ldx, k);
        split.gemm_range(w, y + r0 * ldy, ldy, accumulate, p0, p1);
      } catch (...) {  // only std::bad_alloc of the thread's first planes can occur
        failed.store(true, std::memory_order_relaxed);
      }
    });
    if (failed.load()) throw std::bad_alloc();
    return;
  }

  if (nt <= 1) {
    gemm_rows(kt, x, ldx, w, y, ldy, accumulate, 0, m);
    return;
  }

  if (row_tiles < 4 * nt && row_tiles * kTileRows * k <= kMaxWholeA) {
    // Few rows: pack all of A once here (small), split the weight panels among threads.
    std::vector<float, AlignedAllocator<float>> apack(gemm_packed_a_floats(m, k));
    pack_a(x, ldx, m, k, apack.data(), packed_group(kt));
    const size_t tasks = task_count(panels, nt, panels);
    parallel_dynamic(workers, static_cast<int>(nt), tasks, [&](size_t t, unsigned) {
      size_t p0, p1;
      split_range(panels, tasks, t, &p0, &p1);
      gemm_panels(kt, apack.data(), m, w, y, ldy, accumulate, p0, p1);
    });
    return;
  }

  // Many rows: split the row tiles into blocks of at most MC rows (each packs its own A once);
  // threads share the weight panels through L3.
  const size_t tasks = task_count(row_tiles, nt, kMC / kTileRows);
  std::atomic<bool> failed{false};  // a loop body must not throw: carry it out by hand
  parallel_dynamic(workers, static_cast<int>(nt), tasks, [&](size_t t, unsigned) {
    size_t t0, t1;
    split_range(row_tiles, tasks, t, &t0, &t1);
    try {
      gemm_rows(kt, x, ldx, w, y, ldy, accumulate, t0 * kTileRows, std::min(m, t1 * kTileRows));
    } catch (...) {  // only std::bad_alloc from a_scratch() can occur
      failed.store(true, std::memory_order_relaxed);
    }
  });
  if (failed.load()) throw std::bad_alloc();
}

void gemv_range(const float* x, const PackedWeight& w, float* y, bool accumulate, size_t p0,
                size_t p1) {
  if (p0 >= p1 || w.cols() == 0) {
    if (!accumulate && p0 < p1) {
      const size_t c0 = p0 * kPanelWidth, c1 = std::min(p1 * kPanelWidth, w.rows());
      std::memset(y + c0, 0, (c1 - c0) * sizeof(float));
    }
    return;
  }
  gemv_panels(kernels(), x, w, y, accumulate, p0, p1);
}

void gemm_range(const float* x, size_t m, size_t ldx, const PackedWeight& w, float* y, size_t ldy,
                bool accumulate, size_t p0, size_t p1) {
  p1 = std::min(p1, w.panels());
  if (m == 0 || p0 >= p1) return;
  if (m == 1 || w.cols() == 0) {  // gemv_range: the m = 1 sums of matmul_xwt, and k = 0
    for (size_t r = 0; r < m; ++r) gemv_range(x + r * ldx, w, y + r * ldy, accumulate, p0, p1);
    return;
  }
  if (amx::applies(w, m)) {  // matmul_xwt's AMX tiles, on this thread
    thread_local amx::SplitRows split;
    for (size_t r0 = 0; r0 < m; r0 += amx::kBlockRows) {  // planes of kBlockRows rows at a time
      split.prepare(x + r0 * ldx, std::min(amx::kBlockRows, m - r0), ldx, w.cols());
      split.gemm_range(w, y + r0 * ldy, ldy, accumulate, p0, p1);
    }
    return;
  }
  if (w.is_q8() || w.is_q4()) {  // the int8 GEMM of matmul_xwt (gemm_int8.h), on this thread
    thread_local int8::QuantRows q;
    q.prepare(m, w);
    q.quantize(x, ldx, w.cols(), 0, m);
    int8::gemm_rect(q, w, y, ldy, accumulate, 0, m, p0, p1);
    return;
  }
  gemm_rows(kernels(), x, ldx, w, y, ldy, accumulate, 0, m, p0, p1);
}

size_t gemm_row_group() { return packed_group(kernels()); }

size_t gemm_packed_a_floats(size_t m, size_t k) {
  const size_t g = packed_group(kernels());
  return (m + g - 1) / g * g * k;
}

void gemm_pack_a(const float* x, size_t m, size_t ldx, size_t k, float* apack) {
  pack_a(x, ldx, m, k, apack, packed_group(kernels()));
}

void gemm_packed_range(const float* apack, size_t m, const PackedWeight& w, float* y, size_t ldy,
                       bool accumulate, size_t p0, size_t p1) {
  p1 = std::min(p1, w.panels());
  if (m == 0 || p0 >= p1) return;
  if (w.cols() == 0) {  // empty sum
    if (!accumulate) {
      const size_t c0 = p0 * kPanelWidth, c1 = std::min(p1 * kPanelWidth, w.rows());
      for (size_t i = 0; i < m; ++i) std::memset(y + i * ldy + c0, 0, (c1 - c0) * sizeof(float));
    }
    return;
  }
  gemm_panels(kernels(), apack, m, w, y, ldy, accumulate, p0, p1);
}

void dequantize(const PackedWeight& w, float* out) {
  const size_t n = w.rows(), k = w.cols();
  alignas(64) float buf[kKC * kPanelWidth];
  for (size_t p = 0; p < w.panels(); ++p) {
    for (size_t pc = 0; pc < k; pc += kKC) {
      const size_t kc = std::min(kKC, k - pc);
      const float* s = panel_slice(kernels(), w, p, pc, kc, buf);
      if (w.is_bf16()) {  // panel_slice widens bf16 only for the generic table: widen here
        for (size_t t = 0; t < kc * kPanelWidth; ++t) {
          buf[t] = bits_to_f32(static_cast<uint32_t>(w.panel_bf16(p)[pc * kPanelWidth + t]) << 16);
        }
        s = buf;
      }
      for (size_t c = 0; c < kPanelWidth && p * kPanelWidth + c < n; ++c) {
        for (size_t t = 0; t < kc; ++t) out[(p * kPanelWidth + c) * k + pc + t] = s[t * kPanelWidth + c];
      }
    }
  }
}

const char* kernel_name() { return kernels().name; }

const char* q8_kernel_name() { return q8::kernel_name(); }

const char* q4_kernel_name() { return q4::kernel_name(); }

const char* int8_kernel_name() { return int8::kernel_name(); }

}  // namespace kvr::cpu
