// Allocation of large, long-lived buffers (packed weights) so that Linux backs them with
// transparent huge pages where it offers them (THP mode "madvise", the default of many
// distributions: only regions that ask get 2 MiB pages). Why: a decode step streams every weight
// once; on 4 KiB pages each stream crosses a page every 4 KiB — a TLB miss and a page walk, nested
// (two-level) in a VM — and the hardware prefetcher stops at every page boundary. Measured on a
// 2-vCPU Sapphire Rapids VM: streaming reads at 27 GB/s on 4 KiB pages, 37 GB/s on huge pages
// (docs/native.md "Decode step"). Not a general allocator: small buffers keep plain aligned_alloc.
#pragma once

#include <cstddef>

namespace kvr::cpu {

// Bytes from which a buffer is placed on huge pages (one whole 2 MiB page at least).
constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` bytes aligned to `align` (a power of two, at least alignof(max_align_t)). Buffers of
// at least kHugePageBytes are mapped on their own, 2 MiB aligned, and advised as huge (best
// effort: no huge pages is not an error). Returns nullptr when out of memory. Free only with
// free_maybe_huge and the same bytes and align.
void* alloc_maybe_huge(size_t bytes, size_t align);
void free_maybe_huge(void* p, size_t bytes, size_t align);

// Advises the whole pages inside [p, p + bytes) as huge (best effort; nothing below
// kHugePageBytes): for buffers someone else allocates and frees, e.g. a KV cache (the KV
// recycler's own mappings, a pool's calloc). Pages not yet touched then fault in on huge pages;
// memory already faulted stays on 4 KiB pages. Decode attention streams the whole cache every
// token, as the GEMVs stream the weights.
void advise_huge(void* p, size_t bytes);

}  // namespace kvr::cpu
