// Multi-threaded host memcpy for the device codec's pinned staging (docs/gpu-handoff.md §2): the
// copy between the caller's pageable frame and a pinned slab is the one the CPU does on every
// snapshot chunk, and one thread (~10–20 GB/s) is below the PCIe rate the codec targets. A small
// persistent pool splits each copy into cache-line-aligned stripes. Plus the slab plans of
// export/import (pure arithmetic over the frame). Host only, no CUDA: tested by g++
// (host_copy_test.cpp). Not the codec itself (cuda/codec_host.cpp).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace kvr {

class ParallelCopier {
 public:
  // `threads` >= 1 copiers in all (the calling thread is one of them: threads - 1 workers start).
  explicit ParallelCopier(int threads);
  ~ParallelCopier();
  ParallelCopier(const ParallelCopier&) = delete;
  ParallelCopier& operator=(const ParallelCopier&) = delete;
  // memcpy(dst, src, n), split across the pool when n >= 2 · kMinStripe; returns when all bytes
  // are copied. One copy at a time per copier (callers serialise: one per sequence's staging).
  void copy(void* dst, const void* src, size_t n);
  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Smallest stripe worth a thread handoff (~10 µs of wake-up against ~50 µs of copying).
  static constexpr size_t kMinStripe = 512u << 10;

 private:
  void work(size_t worker);
  void copy_stripe(size_t stripe, size_t stripes);
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;  // bumped per copy; workers run each generation once
  size_t pending_ = 0;       // workers still copying the current generation
  size_t stripes_ = 0;       // stripes of the current copy (<= threads)
  bool stop_ = false;
  uint8_t* dst_ = nullptr;
  const uint8_t* src_ = nullptr;
  size_t n_ = 0;
};

// One pipelined piece of a frame: bytes [o0, o1) through pinned slab `buf` (0 or 1). `after_layer`
// (export only): the piece may start once the encode of layers [.., after_layer) is done.
struct SlabPiece {
  size_t o0 = 0, o1 = 0;
  int buf = 0;
  size_t after_layer = 0;
};

// Export: runs of whole layers of about slab_bytes each (a larger layer is copied in slab_bytes
// pieces); layer l's bytes are [layer_offset(l), layer_offset(l + 1)) with
// layer_offset(l) = first + l · layer_bytes. The pieces cover [first, first + layers·layer_bytes)
// in order, alternating buffers, each <= slab_bytes.
std::vector<SlabPiece> export_slab_plan(size_t first, size_t layer_bytes, size_t layers, size_t slab_bytes);
// Import: the whole frame [0, frame_len) in slab_bytes pieces, alternating buffers.
std::vector<SlabPiece> import_slab_plan(size_t frame_len, size_t slab_bytes);
// Layers encoded per export slab (>= 1).
size_t layers_per_slab(size_t layer_bytes, size_t slab_bytes);

}  // namespace kvr
