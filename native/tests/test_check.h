// Check counting and a seeded xorshift64 for the g++ unit tests (*_test.cpp beside the code): a
// test counts its checks, prints the first failures and ends with report(), which prints
// "<name>: N checks, M failed" and gives the exit status. Test-only: libkvrelay never includes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>

namespace kvr::test {

inline size_t checks = 0, failed = 0;

inline void check(bool ok, const char* what, unsigned long long a, unsigned long long b) {
  ++checks;
  if (!ok) {
    ++failed;
    if (failed < 20) std::printf("FAIL %s: %llu vs %llu\n", what, a, b);
  }
}

inline int report(const char* name) {
  std::printf("%s: %zu checks, %zu failed\n", name, checks, failed);
  return failed == 0 ? 0 : 1;
}

// xorshift64 (13, 7, 17): the state is the seed; the top 53 bits are used.
struct XorShift64 {
  uint64_t state;
  uint32_t next() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<uint32_t>(state >> 11);
  }
  uint32_t below(uint32_t n) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<uint32_t>((state >> 11) % n);
  }
};

}  // namespace kvr::test
