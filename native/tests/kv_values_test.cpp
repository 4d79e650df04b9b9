// g++ unit tests of kv_values.h against value_fault, the per-element rule it stands in for:
// fault_bits is the exact cut for every 16-bit pattern of bf16/f16 and for f32 patterns on every
// top-20-bit prefix plus the neighbourhood of each cut, for all three cache types; block_accepted
// agrees with an element loop on random unaligned blocks with one planted value; and
// accepted_magnitude is accepted while the next f32 up is refused. Built by CMake as
// kvr_kv_values_test; run by kv_values_test.ts.
#include "host/kv_values.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "host/dtype.h"

namespace {

using namespace kvr;

int g_checks = 0, g_failures = 0;

void check(bool ok, const char* what, unsigned long long a = 0, unsigned long long b = 0) {
  ++g_checks;
  if (!ok && ++g_failures <= 20) std::printf("FAIL %s (0x%llx, 0x%llx)\n", what, a, b);
}

const uint32_t kCaches[] = {KVR_DTYPE_F32, KVR_DTYPE_BF16, KVR_DTYPE_F16};

float widen(uint32_t bits, uint32_t enc) {
  if (enc == KVR_DTYPE_F32) return bits_f32(bits);
  return enc == KVR_DTYPE_BF16 ? bf16_to_f32(static_cast<uint16_t>(bits)) : f16_to_f32(static_cast<uint16_t>(bits));
}

bool refused(uint32_t bits, uint32_t enc, uint32_t cache) { return value_fault(widen(bits, enc), cache)[0] != 0; }

void test_cuts() {
  for (uint32_t cache : kCaches) {
    for (uint32_t enc : {KVR_DTYPE_BF16, KVR_DTYPE_F16}) {
      const uint32_t cut = fault_bits(enc, cache);
      for (uint32_t h = 0; h <= 0xffffu; ++h)
        check(((h & 0x7fffu) >= cut) == refused(h, enc, cache), "16-bit cut", h, cache);
    }
    const uint32_t cut = fault_bits(KVR_DTYPE_F32, cache);
    std::mt19937 rng(7 + cache);
    for (uint32_t top = 0; top < (1u << 20); ++top) {
      const uint32_t bits = (top << 12) | (rng() & 0xfffu);
      check(((bits & 0x7fffffffu) >= cut) == refused(bits, KVR_DTYPE_F32, cache), "f32 cut", bits, cache);
    }
    for (uint32_t d = 0; d < 8192; ++d) {
      const uint32_t bits = cut - 4096 + d;
      check((bits >= cut) == refused(bits, KVR_DTYPE_F32, cache), "f32 cut neighbourhood", bits, cache);
      check((bits >= cut) == refused(bits | 0x80000000u, KVR_DTYPE_F32, cache), "negative", bits, cache);
    }
    const double m = accepted_magnitude(cache);
    check(!refused(f32_bits(static_cast<float>(m)), KVR_DTYPE_F32, cache), "accepted_magnitude accepted");
    check(refused(f32_bits(static_cast<float>(m)) + 1, KVR_DTYPE_F32, cache), "next f32 refused");
  }
  // the cuts the formats imply, as an independent statement of the same facts
  check(fault_bits(KVR_DTYPE_F32, KVR_DTYPE_F32) == 0x4b800001u, "f32 into f32: just above 2^24");
  check(fault_bits(KVR_DTYPE_F32, KVR_DTYPE_BF16) == 0x4b800001u, "f32 into bf16: just above 2^24");
  check(fault_bits(KVR_DTYPE_BF16, KVR_DTYPE_F32) == 0x4b81u, "bf16 into f32: just above 2^24");
  check(fault_bits(KVR_DTYPE_F32, KVR_DTYPE_F16) == 0x477ff000u, "f32 into f16: 65520");
  check(fault_bits(KVR_DTYPE_BF16, KVR_DTYPE_F16) == 0x4780u, "bf16 into f16: 65536");
  check(fault_bits(KVR_DTYPE_F16, KVR_DTYPE_BF16) == 0x7c00u, "f16 into bf16: infinity");
  check(accepted_magnitude(KVR_DTYPE_F32) == 16777216.0, "f32 cache: 2^24 accepted");
  // the message names head, absolute token position and dim of element 1·(4·8) + 2·8 + 3
  const std::string msg = value_fault_message(3e38f, KVR_DTYPE_F32, 1, 2, true, 32 + 16 + 3, 4, 8, 100);
  check(msg.find("chunk 1 layer 2 V, head 1, token position 102, dim 3: value 3e+38 exceeds the KV magnitude "
                 "bound 16777216") == 0,
        "bound message");
}

void test_blocks() {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> buf(4 * 4096 + 8);
  for (int t = 0; t < 3000; ++t) {
    const uint32_t enc = kCaches[t % 3], cache = kCaches[(t / 3) % 3];
    const size_t es = enc == KVR_DTYPE_F32 ? 4 : 2, n = rng() % 4096, off = rng() % 4;
    uint8_t* p = buf.data() + off;
    for (size_t i = 0; i < n; ++i) {  // ordinary KV magnitudes
      const float x = static_cast<float>(static_cast<int64_t>(rng() % 20001) - 10000) / 1000.0f;
      if (enc == KVR_DTYPE_F32) std::memcpy(p + 4 * i, &x, 4);
      const uint16_t h = enc == KVR_DTYPE_BF16 ? f32_to_bf16(x) : f32_to_f16(x);
      if (enc != KVR_DTYPE_F32) std::memcpy(p + 2 * i, &h, 2);
    }
    if (n > 0 && t % 2 == 0) {  // one planted pattern anywhere, from the whole bit range
      const size_t at = rng() % n;
      const uint32_t bits = static_cast<uint32_t>(rng());
      std::memcpy(p + es * at, &bits, es);
    }
    bool want = true;
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, p + es * i, es);
      want = want && !refused(bits, enc, cache);
    }
    check(block_accepted(p, n, enc, fault_bits(enc, cache)) == want, "block_accepted vs element loop", t, n);
  }
}

}  // namespace

int main() {
  test_cuts();
  test_blocks();
  std::printf("kv_values: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
