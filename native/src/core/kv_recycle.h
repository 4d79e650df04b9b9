// Per-model recycling of contiguous KV cache buffers (CPU backend). Why: a freed cache went back
// to glibc, which trims the heap top (or unmaps a chunk it had mmapped); the next sequence's calloc
// then got fresh pages, and its first writer (a snapshot import, a prefill) took one minor page
// fault per 4 KiB — measured on tiny-fast's 2 MiB f32 cache: ~480 faults, ~0.6 ms, more than the
// bf16 snapshot import's own work. Kept buffers are resident and all-zero (the releasing cache
// clears what its sequence may have written: KvCache::clear_written), so a sequence built on one
// reads exactly what a fresh calloc would give — no earlier sequence's KV.
// Bounded: at most max_buffers buffers and max_bytes bytes kept per model; the oldest kept buffers
// are freed to make room, and a buffer larger than max_bytes is freed at once. Not the paged pool
// (kv_pool.h), whose blocks never leave their arena.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kvr {

class KvRecycler {
 public:
  struct Buffer {
    uint8_t* data = nullptr;
    size_t bytes = 0;  // the allocation's size (at least what was asked)
  };

  KvRecycler(size_t max_bytes, size_t max_buffers) : max_bytes_(max_bytes), max_buffers_(max_buffers) {
    kept_.reserve(max_buffers);  // give() never allocates (it runs in destructors)
  }
  KvRecycler(const KvRecycler&) = delete;
  KvRecycler& operator=(const KvRecycler&) = delete;
  ~KvRecycler() {
    for (const Buffer& b : kept_) release(b);
  }

  // Buffers from this size on are mapped on their own, outside malloc's heap: a kept buffer there
  // would pin memory in the heap that other allocations could no longer reuse.
  static constexpr size_t kMapBytes = size_t{256} << 10;
  // A zero-filled allocation of `bytes` (nullptr when out of memory); free with release().
  static Buffer allocate(size_t bytes) {
#if defined(__linux__)
    if (bytes >= kMapBytes) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      return Buffer{p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p), bytes};
    }
#endif
    return Buffer{static_cast<uint8_t*>(std::calloc(bytes, 1)), bytes};
  }
  static void release(Buffer b) noexcept {
    if (b.data == nullptr) return;
#if defined(__linux__)
    if (b.bytes >= kMapBytes) {
      munmap(b.data, b.bytes);
      return;
    }
#endif
    std::free(b.data);
  }

  // An all-zero buffer of at least `bytes` bytes: the smallest kept one of [bytes, 2·bytes] (a
  // larger one would hold memory the sequence cannot use), else a fresh calloc (data nullptr when
  // out of memory).
  Buffer take(size_t bytes) {
    {
      std::lock_guard<std::mutex> g(mu_);
      size_t best = kept_.size();
      for (size_t i = 0; i < kept_.size(); ++i) {
        const size_t b = kept_[i].bytes;
        if (b >= bytes && b / 2 <= bytes && (best == kept_.size() || b < kept_[best].bytes)) best = i;
      }
      if (best < kept_.size()) {
        const Buffer out = kept_[best];
        kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(best));
        kept_bytes_ -= out.bytes;
        return out;
      }
    }
    return allocate(bytes);
  }

  // Takes back a buffer from take() whose every byte is zero again. Kept (newest last) after
  // freeing the oldest kept buffers it needs room from, or freed when larger than max_bytes.
  void give(Buffer b) noexcept {
    if (b.data == nullptr) return;
    if (b.bytes > max_bytes_ || max_buffers_ == 0) {
      release(b);
      return;
    }
    std::lock_guard<std::mutex> g(mu_);
    size_t drop = 0, freed = 0;
    while (kept_.size() - drop + 1 > max_buffers_ || kept_bytes_ - freed + b.bytes > max_bytes_) {
      freed += kept_[drop].bytes;
      release(kept_[drop]);
      ++drop;
    }
    kept_.erase(kept_.begin(), kept_.begin() + static_cast<std::ptrdiff_t>(drop));
    kept_bytes_ -= freed;
    kept_.push_back(b);  // capacity max_buffers_ reserved: no allocation, no throw
    kept_bytes_ += b.bytes;
  }

  size_t kept_bytes() const {
    std::lock_guard<std::mutex> g(mu_);
    return kept_bytes_;
  }
  size_t kept_count() const {
    std::lock_guard<std::mutex> g(mu_);
    return kept_.size();
  }

 private:
  const size_t max_bytes_, max_buffers_;
  mutable std::mutex mu_;
  std::vector<Buffer> kept_;  // oldest first
  size_t kept_bytes_ = 0;
};

}  // namespace kvr
