// alloc_maybe_huge / free_maybe_huge (see huge_pages.h). Large buffers are mapped directly, not
// taken from malloc: glibc serves sizes up to its (dynamic, up to 32 MiB) mmap threshold from
// heap memory that earlier temporaries (the load's f32 staging copies) already faulted in on 4 KiB
// pages, and advising such memory changes nothing until khugepaged's slow background pass —
// measured: only 280 of 576 advised MiB were on huge pages after loading Qwen3-0.6B q8 through
// aligned_alloc. A fresh mapping faults in on huge pages as the packer first writes it.
#include "host/huge_pages.h"

#include <cstdint>
#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kvr::cpu {
namespace {

constexpr size_t kPage = 4096;

size_t page_round(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

}  // namespace

void* alloc_maybe_huge(size_t bytes, size_t align) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= kHugePageBytes && bytes <= SIZE_MAX - 2 * kHugePageBytes && align <= kHugePageBytes) {
    // Over-map by one huge page, then unmap the unaligned head and the tail past the pages used.
    const size_t len = page_round(bytes);
    void* raw = mmap(nullptr, len + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t start = (base + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    if (start > base) munmap(raw, start - base);
    const uintptr_t end = base + len + kHugePageBytes;
    if (end > start + len) munmap(reinterpret_cast<void*>(start + len), end - (start + len));
    void* p = reinterpret_cast<void*>(start);
    madvise(p, len, MADV_HUGEPAGE);  // best effort: without huge pages the buffer still works
    return p;
  }
#endif
  return std::aligned_alloc(align, (bytes + align - 1) / align * align);
}

void advise_huge(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (p == nullptr || bytes < kHugePageBytes) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), start = (a + kPage - 1) / kPage * kPage;
  const uintptr_t end = (a + bytes) / kPage * kPage;
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

void free_maybe_huge(void* p, size_t bytes, size_t align) {
  if (p == nullptr) return;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= kHugePageBytes && bytes <= SIZE_MAX - 2 * kHugePageBytes && align <= kHugePageBytes) {
    munmap(p, page_round(bytes));
    return;
  }
#endif
  std::free(p);
}

}  // namespace kvr::cpu
