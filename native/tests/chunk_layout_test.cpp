// g++ unit tests of common/chunk_layout.h: frame sizes and block offsets against the format's
// formulas (docs/snapshot-format.md §2), and CRC32C combination (combine, raw register, finalise)
// against a plain bytewise CRC32C over random data and split points. Prints
// "chunk_layout: N checks, M failed"; exit status 1 on any failure. Built by CMake.
#include "common/chunk_layout.h"
#include "test_check.h"

#include <cstdio>
#include <cstdint>
#include <vector>

namespace {

using kvr::test::check;

// The reference: bytewise reflected CRC32C with init ~0 and final inversion (RFC 3720).
uint32_t crc_ref(const uint8_t* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  return ~c;
}

uint32_t raw_of(const uint8_t* p, size_t n) {
  uint32_t c = 0;
  for (size_t i = 0; i < n; ++i) c = kvr::chunk::crc32c_raw_byte(c, p[i]);
  return c;
}

kvr::test::XorShift64 rng{0x9e3779b97f4a7c15ull};
uint32_t rnd() { return rng.next(); }

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace

int main() {
  using kvr::chunk::Layout;
  // "123456789" → 0xE3069283 (the CRC32C check value).
  const uint8_t nine[] = {'1', '2', '3', '4', '5', '6', '7', '8', '9'};
  check(crc_ref(nine, 9) == 0xe3069283u, "check value", crc_ref(nine, 9), 0xe3069283u);
  check(kvr::chunk::crc32c_from_raw(raw_of(nine, 9), 9) == 0xe3069283u, "from_raw check value",
        kvr::chunk::crc32c_from_raw(raw_of(nine, 9), 9), 0xe3069283u);

  std::vector<uint8_t> data(70000);
  for (auto& b : data) b = static_cast<uint8_t>(rnd());
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = trial < 20 ? static_cast<size_t>(trial) : rnd() % data.size();
    const size_t cut = n == 0 ? 0 : rnd() % (n + 1);
    const uint8_t* p = data.data();
    const uint32_t whole = crc_ref(p, n);
    check(kvr::chunk::crc32c_combine(crc_ref(p, cut), crc_ref(p + cut, n - cut), n - cut) == whole, "combine",
          kvr::chunk::crc32c_combine(crc_ref(p, cut), crc_ref(p + cut, n - cut), n - cut), whole);
    const uint32_t raw = kvr::chunk::crc32c_raw_combine(raw_of(p, cut), raw_of(p + cut, n - cut), n - cut);
    check(raw == raw_of(p, n), "raw combine", raw, raw_of(p, n));
    check(kvr::chunk::crc32c_from_raw(raw, n) == whole, "from_raw", kvr::chunk::crc32c_from_raw(raw, n), whole);
    // many equal pieces and a ragged tail, combined left to right (the GPU's reduction shape)
    const size_t seg = 1 + rnd() % 2048;
    uint32_t acc = 0;
    for (size_t o = 0; o < n; o += seg) {
      const size_t len = n - o < seg ? n - o : seg;
      acc = kvr::chunk::crc32c_raw_combine(acc, raw_of(p + o, len), len);
    }
    check(kvr::chunk::crc32c_from_raw(acc, n) == whole, "segments", kvr::chunk::crc32c_from_raw(acc, n), whole);
  }

  // Layout against the format's formulas for every encoding over odd shapes.
  for (uint32_t enc = 0; enc <= 4; ++enc) {
    for (size_t t : {1u, 7u, 16u, 255u}) {
      for (size_t d : {1u, 3u, 64u}) {
        Layout L;
        L.encoding = enc;
        L.group = enc == 4 ? 5 : 0;
        L.layers = 3;
        L.heads = 2;
        L.tokens = t;
        L.dim = d;
        const size_t n = 2 * t * d;
        size_t k = 0, v = 0;
        if (enc == 0) k = v = 4 * n;
        if (enc == 1 || enc == 2) k = v = 2 * n;
        if (enc == 3) {
          k = 4 * 2 * d + n;
          v = 4 * 2 * t + n;
        }
        if (enc == 4) {
          k = 8 * 2 * ceil_div(t, 5) * d + ceil_div(n, 2);
          v = 8 * 2 * t * ceil_div(d, 5) + ceil_div(n, 2);
        }
        check(L.k_block_bytes() == k, "k block", L.k_block_bytes(), k);
        check(L.v_block_bytes() == v, "v block", L.v_block_bytes(), v);
        check(L.frame_bytes() == 12 + 3 * (k + v), "frame", L.frame_bytes(), 12 + 3 * (k + v));
        check(L.v_offset(2) == 8 + 2 * (k + v) + k, "v offset", L.v_offset(2), 8 + 2 * (k + v) + k);
      }
    }
  }
  return kvr::test::report("chunk_layout");
}
