// Benchmark of ParallelCopier (host_copy.h) against one memcpy: GB/s of the host-side copy the
// device codec does for every snapshot byte (pageable frame <-> pinned slab), at 4/16/64/256 MB
// with 1 and 2 copier threads. No GPU: the "pinned" side is ordinary memory, mlock'ed when the
// limit allows (said in the output). Configurations interleave per round; medians. Built by CMake
// as kvr_host_copy_bench; run it on an otherwise idle machine (docs/gpu-handoff.md). Prints JSON.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "host/host_copy.h"

namespace {

double seconds_of(void (*fn)(void*, void*, const void*, size_t), void* ctx, void* dst, const void* src, size_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  fn(ctx, dst, src, n);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void plain(void*, void* d, const void* s, size_t n) { std::memcpy(d, s, n); }
void pooled(void* c, void* d, const void* s, size_t n) { static_cast<kvr::ParallelCopier*>(c)->copy(d, s, n); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 9;
  const size_t sizes_mb[] = {4, 16, 64, 256};
  const size_t max = sizes_mb[3] << 20;
  // 64-byte aligned, every page touched before timing (first-touch faults are not the copy)
  auto* src = static_cast<uint8_t*>(std::aligned_alloc(4096, max));
  auto* dst = static_cast<uint8_t*>(std::aligned_alloc(4096, max));
  if (!src || !dst) return 1;
  for (size_t i = 0; i < max; ++i) src[i] = static_cast<uint8_t>(i * 131u);
  std::memset(dst, 0, max);
  const bool locked = mlock(dst, max) == 0;
  kvr::ParallelCopier one(1), two(2);
  std::printf("{\"rounds\": %d, \"dst_mlocked\": %s, \"rows\": [", rounds, locked ? "true" : "false");
  for (size_t si = 0; si < 4; ++si) {
    const size_t n = sizes_mb[si] << 20;
    std::vector<double> t_memcpy, t_one, t_two;
    for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up
      const double a = seconds_of(plain, nullptr, dst, src, n);
      const double b = seconds_of(pooled, &one, dst, src, n);
      const double c = seconds_of(pooled, &two, dst, src, n);
      if (r == 0) continue;
      t_memcpy.push_back(a);
      t_one.push_back(b);
      t_two.push_back(c);
    }
    if (std::memcmp(dst, src, n) != 0) return 2;  // the copies really happened
    const double gb = static_cast<double>(n) / 1e9;
    std::printf("%s{\"mb\": %zu, \"memcpy_GBps\": %.2f, \"copier1_GBps\": %.2f, \"copier2_GBps\": %.2f}", si ? ", " : "",
                sizes_mb[si], gb / median(t_memcpy), gb / median(t_one), gb / median(t_two));
  }
  std::printf("]}\n");
  return 0;
}
