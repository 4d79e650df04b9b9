// CRC32C for snapshot chunks: SSE4.2 crc32 (8 bytes per instruction) chosen at run time, with a
// slice-by-1 table fallback. Not the C ABI wrapper (kv_codec.cpp) nor the TypeScript twin
// (lib/snapshot/crc32c.ts), which tests compare this against.
#include "host/kv_quant.h"

#include <cstring>

#include "host/cpu_features.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace kvr::cpu {

namespace {

struct Table {
  uint32_t t[256];
  Table() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c & 1u) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[b] = c;
    }
  }
};

uint32_t crc_table(const uint8_t* p, size_t n, uint32_t c) {
  static const Table table;
  for (size_t i = 0; i < n; ++i) c = table.t[(c ^ p[i]) & 0xffu] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_sse42(const uint8_t* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c64);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return c32;
}
#endif

}  // namespace

uint32_t crc32c(const uint8_t* data, size_t len, uint32_t crc) {
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (use_sse42_crc()) return ~crc_sse42(data, len, c);
#endif
  return ~crc_table(data, len, c);
}

}  // namespace kvr::cpu
