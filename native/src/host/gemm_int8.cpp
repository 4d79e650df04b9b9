// Driver of the int8 GEMM (gemm_int8.h): activation row quantization, cache blocking of tiles over
// (row block × panel chunk), the thread split and the runtime choice of tile kernels
// (gemm_int8_avx512.cpp, gemm_int8_avxvnni.cpp; cpu_features.h); threads from OpenMP or the worker
// pool (parallel_for.h). Without VNNI the rows go one by
// one through the q8/q4 GEMV kernels (gemm_q8.cpp / gemm_q4.cpp), which give the same bits.
// Measured speed and quality: docs/int8_gemm.md.
#include "host/gemm_int8.h"

#include <algorithm>
#include <cstring>

#include "host/cpu_features.h"
#include "host/gemm_int8_kernels.h"
#include "host/gemm_q4.h"
#include "host/gemm_q8.h"
#include "host/parallel_for.h"

namespace kvr::cpu::int8 {
namespace {

using detail::kTileCols;
using detail::TileKernels;
using detail::XRows;

constexpr size_t kB = PackedWeight::kQ8Block;  // 32
constexpr size_t kMaxTileRows = 6;
// Weight bytes per panel chunk: the chunk stays in L2 (2 MiB here) while every row tile of a row
// block streams past it; one tile's rows (≤ 6·kq bytes) stay in L1 across the chunk's panels.
constexpr size_t kChunkBytes = size_t{256} << 10;
// Activation code bytes per row block (a task's rows), re-read once per panel chunk.
constexpr size_t kRowBlockBytes = size_t{64} << 10;

// nullptr: no VNNI tiles (per-row GEMV).
const TileKernels* choose() {
  if (use_avx512_vnni()) return &detail::avx512_vnni_tiles();
  if (use_avx_vnni()) return &detail::avx_vnni_tiles();
  return nullptr;
}

const TileKernels* tiles() {
  static const auto t = per_cap(&choose);  // one per KernelCap (cpu_features.h)
  return t[cap_index()];
}

size_t tile_rows(const TileKernels& t, bool q4) { return std::min(kMaxTileRows, q4 ? t.q4_rows : t.q8_rows); }

// y rows [r0, r1) through the GEMV of each row (same bits as the tiles).
void rows_by_gemv(const QuantRows& q, const PackedWeight& w, float* y, size_t ldy, bool accumulate,
                  size_t r0, size_t r1, size_t p0, size_t p1) {
  const size_t kq = q.blocks * kB;
  for (size_t r = r0; r < r1; ++r) {
    const int8_t* c = q.codes.data() + r * kq;
    const float* dx = q.dx.data() + r * q.blocks;
    if (q.q4) {
      q4::gemv(w, c, dx, q.dxs.data() + r * q.blocks, p0, p1, y + r * ldy, accumulate);
    } else {
      q8::gemv(w, c, dx, q.xoff.data() + r * q.blocks, p0, p1, y + r * ldy, accumulate);
    }
  }
}

}  // namespace

void QuantRows::prepare(size_t m_rows, const PackedWeight& w) {
  m = m_rows;
  blocks = w.q8_blocks();
  q4 = w.is_q4();
  const size_t kq = blocks * kB;
  if (codes.size() < m * kq) codes.resize(m * kq);
  if (dx.size() < m * blocks) dx.resize(m * blocks);
  if (q4 && dxs.size() < m * blocks) dxs.resize(m * blocks);
  if (!q4 && xoff.size() < m * blocks) xoff.resize(m * blocks);
}

void QuantRows::quantize(const float* x, size_t ldx, size_t k, size_t r0, size_t r1) {
  const size_t kq = blocks * kB;
  int32_t sums[256];  // per-block Σq, in pieces of 256 blocks (8192 inputs)
  for (size_t r = r0; r < r1; ++r) {
    int8_t* c = codes.data() + r * kq;
    float* d = dx.data() + r * blocks;
    // As gemm.cpp's GEMV: q8 xoff = −128·Σq, q4 dxs = dx·Σq per block.
    for (size_t b0 = 0; b0 < blocks; b0 += 256) {
      const size_t nb = std::min<size_t>(256, blocks - b0), k0 = b0 * kB;
      q8::quantize_x(x + r * ldx + k0, std::min(k - k0, nb * kB), nb, c + k0, d + b0, sums);
      for (size_t b = 0; b < nb; ++b) {
        if (q4) {
          dxs[r * blocks + b0 + b] = d[b0 + b] * static_cast<float>(sums[b]);
        } else {
          xoff[r * blocks + b0 + b] = -128 * sums[b];
        }
      }
    }
  }
}

void gemm_rect(const QuantRows& q, const PackedWeight& w, float* y, size_t ldy, bool accumulate,
               size_t r0, size_t r1, size_t p0, size_t p1) {
  if (r0 >= r1 || p0 >= p1) return;
  const TileKernels* t = tiles();
  if (t == nullptr) return rows_by_gemv(q, w, y, ldy, accumulate, r0, r1, p0, p1);
  const size_t n = w.rows(), blocks = q.blocks, kq = blocks * kB, R = tile_rows(*t, q.q4);
  const size_t panel_bytes = blocks * (q.q4 ? 320 : 544);
  const size_t chunk = std::max<size_t>(2, kChunkBytes / panel_bytes / 2 * 2);
  alignas(64) float acc[kMaxTileRows * kTileCols];
  for (size_t pc = p0; pc < p1; pc += chunk) {
    const size_t pe = std::min(p1, pc + chunk);
    for (size_t r = r0; r < r1; r += R) {
      const size_t rows = std::min(R, r1 - r);
      const XRows xr{q.codes.data() + r * kq, kq, q.dx.data() + r * blocks,
                     q.q4 ? q.dxs.data() + r * blocks : nullptr, q.q4 ? nullptr : q.xoff.data() + r * blocks,
                     blocks};
      for (size_t p = pc; p < pe; p += 2) {
        const size_t np = std::min<size_t>(2, pe - p);
        if (q.q4) {
          t->q4(rows, np, blocks, xr, w.panel_q4(p), w.panel_q4_scale(p), w.panel_q4_min(p), acc);
        } else {
          t->q8(rows, np, blocks, xr, w.panel_q8(p), w.panel_q8_scale(p), acc);
        }
        const size_t c0 = p * kPanelWidth, nc = std::min(n, (p + np) * kPanelWidth) - c0;
        for (size_t i = 0; i < rows; ++i) {
          float* yr = y + (r + i) * ldy + c0;
          const float* a = acc + i * kTileCols;
          if (accumulate) {
            for (size_t c = 0; c < nc; ++c) yr[c] += a[c];
          } else {
            std::memcpy(yr, a, nc * sizeof(float));
          }
        }
      }
    }
  }
}

void matmul(const float* x, size_t m, size_t ldx, const PackedWeight& w, float* y, size_t ldy,
            bool accumulate, size_t n_threads, Workers workers) {
  const size_t k = w.cols(), panels = w.panels();
  // The caller's buffers, reached by the team through a reference (a thread_local named inside
  // the parallel region would be each worker's own).
  thread_local QuantRows caller_rows;
  QuantRows& q = caller_rows;
  q.prepare(m, w);
  const size_t kq = q.blocks * kB;
  const TileKernels* t = tiles();
  const size_t R = t != nullptr ? tile_rows(*t, q.q4) : 1;
  // Tasks: row blocks (≤ kRowBlockBytes of codes, whole tiles) × panel ranges (whole pairs),
  // about 4 per thread so dynamic scheduling absorbs a thread the OS delays.
  const size_t block_rows = std::max(R, kRowBlockBytes / kq / R * R);
  const size_t row_blocks = (m + block_rows - 1) / block_rows;
  const size_t pairs = (panels + 1) / 2;
  const size_t nt = std::max<size_t>(1, n_threads);
  const size_t parts = nt == 1 ? 1 : std::min(pairs, std::max<size_t>(1, (4 * nt + row_blocks - 1) / row_blocks));
  const size_t tasks = row_blocks * parts;
  auto run_task = [&](size_t i) {
    const size_t rb = i / parts, part = i % parts;
    const size_t r0 = rb * block_rows, r1 = std::min(m, r0 + block_rows);
    const size_t a0 = pairs * part / parts, a1 = pairs * (part + 1) / parts;
    gemm_rect(q, w, y, ldy, accumulate, r0, r1, 2 * a0, std::min(panels, 2 * a1));
  };
  if (nt == 1) {
    q.quantize(x, ldx, k, 0, m);
    for (size_t i = 0; i < tasks; ++i) run_task(i);
    return;
  }
  // Quantize (rows split evenly), then the tiles (claimed one task at a time).
  parallel_static(workers, static_cast<int>(nt), m, [&](size_t r, unsigned) { q.quantize(x, ldx, k, r, r + 1); });
  parallel_dynamic(workers, static_cast<int>(nt), tasks, [&](size_t i, unsigned) { run_task(i); });
}

const char* kernel_name() {
  const TileKernels* t = tiles();
  return t != nullptr ? t->name : "rows";
}

}  // namespace kvr::cpu::int8
