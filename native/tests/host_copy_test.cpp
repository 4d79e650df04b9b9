// g++ unit tests of host_copy.h: ParallelCopier against memcpy over random sizes, offsets and
// thread counts (every byte checked, guard bytes around the destination untouched, back-to-back
// copies on one pool), and the export/import slab plans against their contract (cover the range
// once, in order, alternating buffers, pieces <= slab, export pieces never start before their
// layers are encoded). Built by CMake as kvr_host_copy_test; run by host_copy_test.ts.
#include "host/host_copy.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

using namespace kvr;

int g_checks = 0, g_failures = 0;

void check(bool ok, const char* what, long long a = 0, long long b = 0) {
  ++g_checks;
  if (!ok && ++g_failures <= 20) std::printf("FAIL %s (%lld vs %lld)\n", what, a, b);
}

void test_copier() {
  std::mt19937_64 rng(3);
  const size_t max = 9u << 20;
  std::vector<uint8_t> src(max + 64), dst(max + 192);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (int threads : {1, 2, 3, 4, 8}) {
    ParallelCopier c(threads);
    check(c.threads() == threads, "threads()", c.threads(), threads);
    for (int t = 0; t < 40; ++t) {
      // sizes around the stripe threshold and up to 9 MiB; unaligned source and destination
      const size_t sizes[] = {0, 1, 63, ParallelCopier::kMinStripe * 2 - 1, ParallelCopier::kMinStripe * 2 + 13,
                              static_cast<size_t>(rng() % max)};
      const size_t n = sizes[t % 6];
      const size_t so = rng() % 64, dof = 64 + rng() % 64;
      std::memset(dst.data(), 0xA5, dst.size());
      c.copy(dst.data() + dof, src.data() + so, n);
      check(std::memcmp(dst.data() + dof, src.data() + so, n) == 0, "copied bytes equal the source",
            static_cast<long long>(n), threads);
      bool guard = true;
      for (size_t i = 0; i < dof; ++i) guard &= dst[i] == 0xA5;
      for (size_t i = dof + n; i < dst.size(); ++i) guard &= dst[i] == 0xA5;
      check(guard, "bytes outside [dst, dst + n) untouched", static_cast<long long>(n), threads);
    }
  }
}

void test_plans() {
  std::mt19937_64 rng(5);
  for (int t = 0; t < 2000; ++t) {
    const size_t slab = 1 + rng() % 5000, layer = 1 + rng() % 3000, layers = 1 + rng() % 40, first = rng() % 16;
    const std::vector<SlabPiece> p = export_slab_plan(first, layer, layers, slab);
    const size_t per = layers_per_slab(layer, slab);
    size_t at = first;
    bool ok = !p.empty();
    for (size_t j = 0; j < p.size(); ++j) {
      ok &= p[j].o0 == at && p[j].o1 > p[j].o0 && p[j].o1 - p[j].o0 <= slab && p[j].buf == static_cast<int>(j % 2);
      // the piece lies within the layers encoded before it, and its run is a multiple of per
      ok &= p[j].after_layer <= layers && p[j].o1 <= first + p[j].after_layer * layer;
      ok &= p[j].after_layer == layers || p[j].after_layer % per == 0;
      ok &= j == 0 || p[j].after_layer >= p[j - 1].after_layer;
      at = p[j].o1;
    }
    check(ok && at == first + layers * layer, "export plan covers the payload once, in order", static_cast<long long>(at),
          static_cast<long long>(first + layers * layer));
    const size_t len = 1 + rng() % 100000;
    const std::vector<SlabPiece> q = import_slab_plan(len, slab);
    at = 0;
    ok = true;
    for (size_t j = 0; j < q.size(); ++j) {
      ok &= q[j].o0 == at && q[j].o1 > q[j].o0 && q[j].o1 - q[j].o0 <= slab && q[j].buf == static_cast<int>(j % 2);
      at = q[j].o1;
    }
    check(ok && at == len, "import plan covers the frame once, in order", static_cast<long long>(at),
          static_cast<long long>(len));
  }
  check(layers_per_slab(0, 100) == 100 && layers_per_slab(300, 100) == 1 && layers_per_slab(30, 100) == 3,
        "layers_per_slab");
}

}  // namespace

int main() {
  test_copier();
  test_plans();
  std::printf("host_copy: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
