// g++ unit tests of kv_recycle.h (KvRecycler) and of KvCache's release into it (kv_cache.h):
// caches of random geometry are written through KvCache::at at random positions below what they
// reserved, destroyed, and every buffer the recycler hands out afterwards is checked byte by byte
// to be all-zero (no earlier sequence's KV); the kept count and bytes never pass the budget, are
// what the oldest-first eviction rule says, and go back to the full set once every cache is freed.
// Prints "kv_recycle: N checks, M failed"; exit status 1 on any failure. Built by CMake; run by
// kv_recycle_test.ts.
#include "core/kv_recycle.h"
#include "test_check.h"

#include <cstdio>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/kv_cache.h"

namespace {

using kvr::test::check;

kvr::test::XorShift64 rng{0x9e3779b97f4a7c15ull};
uint32_t rnd(uint32_t n) { return rng.below(n); }

// Index of the first nonzero byte of b, or b.bytes when all are zero.
size_t first_nonzero(const kvr::KvRecycler::Buffer& b) {
  for (size_t i = 0; i < b.bytes; ++i)
    if (b.data[i] != 0) return i;
  return b.bytes;
}

struct Geometry {
  size_t layers, kv_heads, head_dim, elem, capacity;
  size_t bytes() const { return 2 * layers * kv_heads * head_dim * elem * capacity; }
};

Geometry random_geometry() {
  static const size_t elems[] = {2, 4};
  // capacities around and across the 256 KiB mapping cut (kv_recycle.h kMapBytes)
  return Geometry{1 + rnd(4), 1 + rnd(3), 8u << rnd(4), elems[rnd(2)], 1 + rnd(700)};
}

// A cache on a buffer from r, as the CPU backend builds one.
std::unique_ptr<kvr::KvCache> make_cache(const std::shared_ptr<kvr::KvRecycler>& r, const Geometry& g) {
  auto c = std::make_unique<kvr::KvCache>();
  c->elem = g.elem;
  c->layers = g.layers;
  c->kv_heads = g.kv_heads;
  c->head_dim = g.head_dim;
  c->capacity = g.capacity;
  const kvr::KvRecycler::Buffer b = r->take(g.bytes());
  c->data = b.data;
  c->alloc_bytes = b.bytes;
  c->recycler = r;
  return c;
}

// Reserves `tokens` positions in steps (as prefill, decode and kv_write do) and writes nonzero
// bytes at random positions below each step's end, in every layer, K/V and head.
void scribble(kvr::KvCache& c, size_t tokens) {
  size_t done = 0;
  while (done < tokens) {
    const size_t step = 1 + rnd(static_cast<uint32_t>(tokens - done));
    c.reserve(done, done + step);
    done += step;
    for (int w = 0; w < 40; ++w) {
      const size_t p = rnd(static_cast<uint32_t>(done));
      uint8_t* at = c.at(rnd(static_cast<uint32_t>(c.layers)), rnd(2), rnd(static_cast<uint32_t>(c.kv_heads)), p);
      for (size_t i = 0; i < c.head_dim * c.elem; ++i) at[i] = static_cast<uint8_t>(1 + rnd(255));
    }
    // the last position reserved, whole: the high-water mark must cover it
    for (size_t l = 0; l < c.layers; ++l)
      for (size_t g = 0; g < c.kv_heads; ++g) c.at(l, 1, g, done - 1)[0] = 0xff;
  }
}

// Caches of random geometry and fill released into one recycler and taken again: every buffer
// handed out is all-zero and at least the size asked.
void test_no_leak() {
  auto r = std::make_shared<kvr::KvRecycler>(size_t{16} << 20, 6);
  std::vector<Geometry> shapes;
  for (int i = 0; i < 5; ++i) shapes.push_back(random_geometry());
  for (int trial = 0; trial < 400; ++trial) {
    // a few live caches at once, freed in random order
    std::vector<std::unique_ptr<kvr::KvCache>> live;
    const int n = 1 + static_cast<int>(rnd(4));
    for (int i = 0; i < n; ++i) {
      const Geometry& g = shapes[rnd(static_cast<uint32_t>(shapes.size()))];
      auto c = make_cache(r, g);
      check(c->data != nullptr, "allocated", 0, 0);
      check(c->alloc_bytes >= g.bytes() && c->alloc_bytes <= 2 * g.bytes(), "size in [bytes, 2 bytes]",
            c->alloc_bytes, g.bytes());
      const size_t nz = first_nonzero({c->data, c->alloc_bytes});
      check(nz == c->alloc_bytes, "taken buffer all-zero (first nonzero byte)", nz, c->alloc_bytes);
      const uint32_t mode = rnd(4);  // empty, partly written, full, or truncated after writing
      if (mode == 1) scribble(*c, 1 + rnd(static_cast<uint32_t>(g.capacity)));
      if (mode == 2) scribble(*c, g.capacity);
      if (mode == 3) {
        scribble(*c, 1 + rnd(static_cast<uint32_t>(g.capacity)));
        c->shrink(0);  // truncation does not lower the high-water mark
      }
      live.push_back(std::move(c));
    }
    while (!live.empty()) {
      const size_t i = rnd(static_cast<uint32_t>(live.size()));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      check(r->kept_count() <= 6, "kept count within budget", r->kept_count(), 6);
      check(r->kept_bytes() <= (size_t{16} << 20), "kept bytes within budget", r->kept_bytes(), 16u << 20);
    }
  }
}

// The kept set follows the stated rule: newest last, oldest freed first to make room, a buffer
// over max_bytes never kept, best fit within [bytes, 2·bytes], and after every cache is freed
// the kept set is full again (as many buffers as the budget allows).
void test_budget() {
  const size_t mib = size_t{1} << 20;
  auto r = std::make_shared<kvr::KvRecycler>(10 * mib, 3);
  std::vector<kvr::KvRecycler::Buffer> bufs;
  for (size_t sz : {1 * mib, 2 * mib, 3 * mib, 4 * mib}) bufs.push_back(r->take(sz));
  check(r->kept_count() == 0, "nothing kept before any give", r->kept_count(), 0);
  for (const auto& b : bufs) r->give(b);
  // 1+2+3 kept (6 MiB, 3 buffers); giving 4 MiB must evict the 1 MiB (count) → 2+3+4 = 9 MiB
  check(r->kept_count() == 3, "kept count at max_buffers", r->kept_count(), 3);
  check(r->kept_bytes() == 9 * mib, "oldest evicted first", r->kept_bytes(), 9 * mib);
  // best fit: 1.5 MiB wants the 2 MiB one, not 3 or 4
  kvr::KvRecycler::Buffer b = r->take(3 * mib / 2);
  check(b.bytes == 2 * mib, "best fit", b.bytes, 2 * mib);
  // nothing of [1 MiB, 2 MiB] left (3 and 4 are more than twice 1 MiB): a fresh allocation
  kvr::KvRecycler::Buffer c = r->take(1 * mib);
  check(c.bytes == 1 * mib && r->kept_count() == 2, "no fit over 2x: fresh", c.bytes, r->kept_count());
  // a buffer over max_bytes is freed, the kept set unchanged
  kvr::KvRecycler::Buffer big = r->take(11 * mib);
  r->give(big);
  check(r->kept_bytes() == 7 * mib, "over max_bytes not kept", r->kept_bytes(), 7 * mib);
  r->give(b);
  r->give(c);  // 3+4+2 = 9, then 1 → count: evict 3 → 4+2+1 = 7 MiB
  check(r->kept_count() == 3 && r->kept_bytes() == 7 * mib, "full again after every give", r->kept_bytes(),
        7 * mib);
  // byte budget: 5 MiB needs 4 MiB evicted (4+2+1+5 = 12 > 10) → 2+1+5 = 8 MiB
  r->give(r->take(5 * mib));
  check(r->kept_bytes() == 8 * mib && r->kept_count() == 3, "oldest evicted for bytes", r->kept_bytes(), 8 * mib);
  // a zero budget keeps nothing
  auto none = std::make_shared<kvr::KvRecycler>(0, 0);
  none->give(none->take(4096));
  check(none->kept_count() == 0, "zero budget keeps nothing", none->kept_count(), 0);
}

// Caches outlive their recycler's owner (the backend): a shared recycler keeps working.
void test_outlives_owner() {
  std::unique_ptr<kvr::KvCache> c;
  {
    auto r = std::make_shared<kvr::KvRecycler>(size_t{8} << 20, 2);
    c = make_cache(r, Geometry{2, 2, 16, 4, 100});
    scribble(*c, 50);
  }
  c.reset();  // gives back into a recycler no one else holds: kept, then freed with it
}

}  // namespace

int main() {
  test_budget();
  test_no_leak();
  test_outlives_owner();
  return kvr::test::report("kv_recycle");
}
