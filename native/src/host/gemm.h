// The CPU matrix multiply every linear layer uses: y = x · Wᵀ with W pre-packed at load.
// Only the interface lives here; gemm.cpp holds the driver and runtime dispatch, gemm_avx2.cpp
// and gemm_generic.cpp the micro-kernels. Layout and blocking are described in docs/gemm.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

#include "host/huge_pages.h"
#include "host/parallel_for.h"

namespace kvr::cpu {

// Minimal allocator giving 64-byte (cache line) aligned storage for packed panels (2 MiB aligned
// and on huge pages when large, host/huge_pages.h).
template <typename T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr size_t kAlign = 64;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(size_t count) {
    if (count > static_cast<size_t>(-1) / sizeof(T) - kAlign) throw std::bad_alloc();
    const size_t bytes = count * sizeof(T);
    // Large buffers (packed weights) on transparent huge pages: host/huge_pages.h.
    void* p = alloc_maybe_huge(bytes == 0 ? kAlign : bytes, kAlign);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t count) {
    const size_t bytes = count * sizeof(T);
    free_maybe_huge(p, bytes == 0 ? kAlign : bytes, kAlign);
  }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const AlignedAllocator<U>&) const { return false; }
};

// AlignedAllocator whose resize() leaves new elements default-initialized (not zeroed), for
// buffers a packer writes in full: zeroing first would fault in every page on one thread before
// the (parallel) packing writes it again — at load, page faults are most of the packing time.
template <typename T>
struct AlignedUninitAllocator : AlignedAllocator<T> {
  AlignedUninitAllocator() = default;
  template <typename U>
  AlignedUninitAllocator(const AlignedUninitAllocator<U>&) {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};

// Output columns per packed micro-panel (two 8-lane ymm registers).
constexpr size_t kPanelWidth = 16;

// A weight W (n rows = output features, k cols = input features), row-major on input, stored in
// the layout the micro-kernel reads: ceil(n/16) panels, each (k, 16) k-major, columns beyond n
// zero. Elements are f32, or bf16 (the upper 16 bits of an f32) when packed from a bf16 source:
// the kernels widen bf16 exactly (<< 16) on the fly, so a bf16 weight gives bit-identical results
// to the f32 weight holding the same values, at half the bytes. Immutable after pack(); safe to
// share across threads.
class PackedWeight {
 public:
  PackedWeight() = default;
  // Copies and repacks w (n, k) row-major f32. Throws std::bad_alloc on allocation failure.
  static PackedWeight pack(const float* w, size_t n, size_t k);
  // Copies and repacks w (n, k) row-major bf16 bit patterns, kept as bf16. Throws std::bad_alloc.
  static PackedWeight pack_bf16(const uint16_t* w, size_t n, size_t k);
  // One (rows, k) row-major block of bf16 bit patterns; data may be unaligned (a mapped file).
  struct Bf16Rows {
    const void* data;
    size_t rows;
  };
  // Packs the n_parts blocks stacked in order ([q; k; v], [gate; up]) as one bf16 weight of
  // (Σ rows, k), read in place — straight from the mapped checkpoint, no staging copy — with the
  // panels split over the OpenMP default team (each thread first-touches its own panels; the
  // loader sets the team to the model's thread count). Same layout and bits as pack_bf16 of the
  // stacked rows. Throws std::bad_alloc.
  static PackedWeight pack_bf16(const Bf16Rows* parts, size_t n_parts, size_t k);
  // Quantizes w (n, k) row-major f32 to q8 (see "q8 layout" below). Throws std::bad_alloc.
  static PackedWeight pack_q8(const float* w, size_t n, size_t k);
  // Quantizes w (n, k) row-major f32 to q4 (see "q4 layout" below). Throws std::bad_alloc.
  static PackedWeight pack_q4(const float* w, size_t n, size_t k);
  size_t rows() const { return n_; }  // n: output features
  size_t cols() const { return k_; }  // k: input features
  bool is_bf16() const { return bf16_; }
  bool is_q8() const { return q8_; }
  bool is_q4() const { return q4_; }
  // Resident bytes of the packed panels (padding columns included).
  size_t size_bytes() const {
    return data_.size() * sizeof(float) + data16_.size() * sizeof(uint16_t) + data8_.size() +
           q8_scale_.size() * sizeof(uint16_t) + data4_.size() +
           q4_scale_.size() * sizeof(uint16_t) + q4_min_.size() * sizeof(uint16_t);
  }
  size_t panels() const { return (n_ + kPanelWidth - 1) / kPanelWidth; }
  // Panel p (16 output columns p*16 .. p*16+15): (k, 16) elements, k-major, 64-byte aligned.
  // panel() only for f32 weights, panel_bf16() only for bf16 ones (is_bf16()).
  const float* panel(size_t p) const { return data_.data() + p * k_ * kPanelWidth; }
  const uint16_t* panel_bf16(size_t p) const { return data16_.data() + p * k_ * kPanelWidth; }
  // Row r < rows() (one output feature's k weights) as f32, gathered from its panel (f32 or bf16
  // weights: exact; q8/q4: dequantized, the same values as the prefill GEMM's slices): a tied
  // model's embedding lookup reads the lm_head instead of a second copy.
  void row_f32(size_t r, float* out) const;
  // The whole weight as (rows, cols) row-major f32 (f32 or bf16 weights, exact): the inverse of
  // pack(), e.g. for a device upload in the usual row-major layout (kvr_projector_weights).
  void unpack_f32(float* out) const;

  // q8 layout (is_q8()): k padded with zeros to kq = ceil(k/32)·32 and cut into blocks of 32.
  // Per panel and block, 512 code bytes ordered (k/4, 16 columns, 4 consecutive k) — one 64-byte
  // load feeds vpdpbusd 4 k-steps of all 16 columns — plus per column a bf16 scale d:
  // w ≈ d·(code − 128), code = q + 128 with q in [-127, 127] (unsigned, vpdpbusd's first
  // operand; the activation side supplies the −128·Σq that removes the offset, gemm_q8.h).
  // d is absmax/127 of the column's 32 weights rounded up to bf16, and q = rint(w/d) against
  // that stored d. 512 + 32 bytes per 512 weights: 1.0625 bytes per weight, as llama.cpp's Q8_0.
  static constexpr size_t kQ8Block = 32;
  size_t q8_blocks() const { return (k_ + kQ8Block - 1) / kQ8Block; }
  const uint8_t* panel_q8(size_t p) const { return data8_.data() + p * q8_blocks() * 512; }
  const uint16_t* panel_q8_scale(size_t p) const { return q8_scale_.data() + p * q8_blocks() * 16; }

  // q4 layout (is_q4()): the same blocks of 32 (q8_blocks()). Per column and block, w ≈ d·c + m
  // with c in [0, 15] and d, m f16 (llama.cpp Q4_1-like; d and m fitted by least squares at
  // load, gemm_q4.cpp). Per panel and block 256 bytes of codes: byte j·64 + col·4 + e holds
  // k = 4j + e in its low nibble and k = 16 + 4j + e in its high nibble (j < 4) — one 64-byte
  // load, masked and shifted, feeds two vpdpbusd of all 16 columns; then 16 f16 d and 16 f16 m.
  // 0.625 bytes per weight.
  const uint8_t* panel_q4(size_t p) const { return data4_.data() + p * q8_blocks() * 256; }
  const uint16_t* panel_q4_scale(size_t p) const { return q4_scale_.data() + p * q8_blocks() * 16; }
  const uint16_t* panel_q4_min(size_t p) const { return q4_min_.data() + p * q8_blocks() * 16; }

 private:
  size_t n_ = 0;
  size_t k_ = 0;
  bool bf16_ = false;
  bool q8_ = false;
  bool q4_ = false;
  std::vector<uint8_t, AlignedAllocator<uint8_t>> data4_;      // q4 nibbles, or empty
  std::vector<uint16_t, AlignedAllocator<uint16_t>> q4_scale_;  // (panels, blocks, 16) f16 d
  std::vector<uint16_t, AlignedAllocator<uint16_t>> q4_min_;    // (panels, blocks, 16) f16 m
  std::vector<uint8_t, AlignedAllocator<uint8_t>> data8_;     // q8 codes (q + 128), or empty
  std::vector<uint16_t, AlignedAllocator<uint16_t>> q8_scale_;  // (panels, blocks, 16) bf16 d
  std::vector<float, AlignedAllocator<float>> data_;        // f32 panels, or empty
  std::vector<uint16_t, AlignedUninitAllocator<uint16_t>> data16_;  // bf16 panels, or empty
};

// y (m, n) with row stride ldy = x (m, k) with row stride ldx · Wᵀ; when accumulate, y += x · Wᵀ.
// Runs on n_threads threads (>= 1) from `workers` (m = 1: OpenMP always; parallel_for.h). Bounds
// are the caller's: shapes come from the model.
// y must not overlap x or W. Throws std::bad_alloc when a thread's first call cannot allocate its
// ~96 KiB packing scratch (y is then partly written).
void matmul_xwt(const float* x, size_t m, size_t ldx, const PackedWeight& w, float* y,
                size_t ldy, bool accumulate, int n_threads, Workers workers = Workers::kOpenMP);

// y (n) (+)= x (k) · Wᵀ restricted to weight panels [p0, p1) (output columns p0*16 ..
// min(p1*16, n)), on the calling thread: the same sums as matmul_xwt with m = 1, so threads of
// one parallel region can split a GEMV by panels without a fork/join of their own.
void gemv_range(const float* x, const PackedWeight& w, float* y, bool accumulate, size_t p0,
                size_t p1);

// y (m, n) (+)= x (m, k) · Wᵀ restricted to weight panels [p0, p1) (output columns p0*16 ..
// min(p1*16, n)), on the calling thread: the same sums as matmul_xwt, so the threads of one
// parallel region (the batched step, cpu/batch_forward.cpp) can split a GEMM by panels — each
// thread the same panels every step, so its share of the weights stays in its core's cache.
// Throws std::bad_alloc when the thread's first call cannot allocate its packing scratch.
void gemm_range(const float* x, size_t m, size_t ldx, const PackedWeight& w, float* y, size_t ldy,
                bool accumulate, size_t p0, size_t p1);

// Rows of the chosen kernels' packed A tile (16 with tall AVX-512 tiles, else 6): a row block of
// gemm_range that is a multiple of it leaves no partial tile.
size_t gemm_row_group();

// The same for f32/bf16 weights with A packed once by the caller (gemm_pack_a), for threads
// that each take several panel ranges of one GEMM (host/gemm_prepared.h). apack holds
// gemm_packed_a_floats(m, k) floats; gemm_packed_range reads it (m >= 1 rows) and does not
// allocate or throw.
size_t gemm_packed_a_floats(size_t m, size_t k);
void gemm_pack_a(const float* x, size_t m, size_t ldx, size_t k, float* apack);
void gemm_packed_range(const float* apack, size_t m, const PackedWeight& w, float* y, size_t ldy,
                       bool accumulate, size_t p0, size_t p1);

// out (n, k) row-major = the values the kernels use for w (q8/q4: dequantized as the prefill
// GEMM does; f32/bf16: as packed).
void dequantize(const PackedWeight& w, float* out);

// The kernels the calling thread's kernel cap (cpu_features.h) selects on this CPU. Name of the
// q8 / q4 GEMV kernels ("avx512-vnni", "avx-vnni", "avx2" or "generic").
const char* q8_kernel_name();
const char* q4_kernel_name();
// Name of the int8 GEMM tiles q8/q4 weights use for m > 1 ("avx512-vnni", "avx-vnni", or "rows":
// the GEMV once per row).
const char* int8_kernel_name();

// Name of the f32/bf16 GEMM kernel ("avx512", "avx2-fma" or "generic").
const char* kernel_name();

}  // namespace kvr::cpu
