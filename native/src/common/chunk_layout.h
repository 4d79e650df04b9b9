// Byte layout of one snapshot chunk frame (docs/snapshot-format.md §1.3, §2) as plain arithmetic
// usable on the host (g++) and in CUDA kernels (nvcc): payload sizes per layer and the offsets of
// every block (scales, mins, codes) inside a layer, for f32/f16/bf16/q8/q4. Also CRC32C
// combination (crc(A‖B) from crc(A), crc(B), |B|), which lets a GPU checksum a frame in parallel
// pieces and a CPU test check that it equals the sequential CRC. Not the encoder itself.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define KVR_LAYOUT_HD __host__ __device__ __forceinline__
#else
#define KVR_LAYOUT_HD inline
#endif

namespace kvr::chunk {

constexpr uint32_t kEncF32 = 0, kEncF16 = 1, kEncBf16 = 2, kEncQ8 = 3, kEncQ4 = 4;
constexpr uint32_t kMaxGroup = 1024;
constexpr size_t kFrameHeadBytes = 8;  // index u32, tokens u32
constexpr size_t kFrameCrcBytes = 4;

// One chunk's geometry: H kv heads, T tokens, D head_dim, L layers, encoding, q4 group G.
struct Layout {
  uint32_t encoding = 0, group = 0;
  size_t layers = 0, heads = 0, tokens = 0, dim = 0;

  KVR_LAYOUT_HD size_t n() const { return heads * tokens * dim; }  // elements of one K (or V) block
  KVR_LAYOUT_HD bool lossless() const { return encoding <= kEncBf16; }
  KVR_LAYOUT_HD size_t elem_bytes() const { return encoding == kEncF32 ? 4 : 2; }  // lossless only
  // q4 scale groups of the K block (per channel: groups along tokens) and of the V block.
  KVR_LAYOUT_HD size_t q4_k_groups() const { return heads * ((tokens + group - 1) / group) * dim; }
  KVR_LAYOUT_HD size_t q4_v_groups() const { return heads * tokens * ((dim + group - 1) / group); }
  // q8 scales of the K block (heads, dim) and of the V block (heads, tokens).
  KVR_LAYOUT_HD size_t q8_k_scales() const { return heads * dim; }
  KVR_LAYOUT_HD size_t q8_v_scales() const { return heads * tokens; }

  // Bytes of the K block of one layer (scales, mins and codes included); the V block follows it.
  KVR_LAYOUT_HD size_t k_block_bytes() const {
    if (lossless()) return n() * elem_bytes();
    if (encoding == kEncQ8) return 4 * q8_k_scales() + n();
    return 8 * q4_k_groups() + (n() + 1) / 2;
  }
  KVR_LAYOUT_HD size_t v_block_bytes() const {
    if (lossless()) return n() * elem_bytes();
    if (encoding == kEncQ8) return 4 * q8_v_scales() + n();
    return 8 * q4_v_groups() + (n() + 1) / 2;
  }
  KVR_LAYOUT_HD size_t layer_bytes() const { return k_block_bytes() + v_block_bytes(); }
  KVR_LAYOUT_HD size_t payload_bytes() const { return layers * layer_bytes(); }
  // Unsigned frame: head + payload + CRC (an HMAC tag, when signed, follows and is not counted).
  KVR_LAYOUT_HD size_t frame_bytes() const { return kFrameHeadBytes + payload_bytes() + kFrameCrcBytes; }
  // Offset of layer l's K block from the frame start; its V block is at + k_block_bytes().
  KVR_LAYOUT_HD size_t k_offset(size_t l) const { return kFrameHeadBytes + l * layer_bytes(); }
  KVR_LAYOUT_HD size_t v_offset(size_t l) const { return k_offset(l) + k_block_bytes(); }
  // Inside a q8 block: scales (f32) first, then codes (i8). Inside a q4 block: scales (f32),
  // mins (f32), codes (packed nibbles). Offsets relative to the block start.
  KVR_LAYOUT_HD size_t q8_k_codes() const { return 4 * q8_k_scales(); }
  KVR_LAYOUT_HD size_t q8_v_codes() const { return 4 * q8_v_scales(); }
  KVR_LAYOUT_HD size_t q4_k_mins() const { return 4 * q4_k_groups(); }
  KVR_LAYOUT_HD size_t q4_k_codes() const { return 8 * q4_k_groups(); }
  KVR_LAYOUT_HD size_t q4_v_mins() const { return 4 * q4_v_groups(); }
  KVR_LAYOUT_HD size_t q4_v_codes() const { return 8 * q4_v_groups(); }
};

// ---- CRC32C (Castagnoli, reflected polynomial 0x82F63B78) combination ----
// crc(A‖B) = shift(crc(A), |B|) ^ crc(B), where shift multiplies by x^(8|B|) mod P in GF(2)
// (the "zeros operator" of zlib's crc32_combine, done here by square-and-multiply on polynomials
// instead of 32×32 matrices: 32 steps of carry-less multiply per squaring).

// a·b mod P for reflected 32-bit polynomials (bit 31 = x^0).
KVR_LAYOUT_HD uint32_t crc32c_mulmod(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1u) ? (b >> 1) ^ 0x82f63b78u : b >> 1;
  }
  return p;
}

// x^(8n) mod P (reflected): the factor that appends n zero bytes to a raw CRC register.
KVR_LAYOUT_HD uint32_t crc32c_x8n(uint64_t n) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t sq = 1u << 23;      // x^8 (reflected: bit 31-8)
  while (n != 0) {
    if (n & 1u) result = crc32c_mulmod(sq, result);
    sq = crc32c_mulmod(sq, sq);
    n >>= 1;
  }
  return result;
}

// crc(A‖B) from crc_a = crc32c(A), crc_b = crc32c(B) (both finalised, starting from 0) and
// len_b = |B| bytes. With the pre/post inversion of CRC32C: crc(A‖B) = crc_a·x^(8|B|) ^ crc_b.
KVR_LAYOUT_HD uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return crc32c_mulmod(crc32c_x8n(len_b), crc_a) ^ crc_b;
}

// The "raw" CRC register (start 0, no final inversion) is linear: raw(A‖B) = raw(A)·x^(8|B|) ^
// raw(B), so pieces can be checksummed independently (a GPU thread per piece) and combined.
KVR_LAYOUT_HD uint32_t crc32c_raw_byte(uint32_t c, uint8_t b) {
  c ^= b;
  for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  return c;
}
KVR_LAYOUT_HD uint32_t crc32c_raw_combine(uint32_t raw_a, uint32_t raw_b, uint64_t len_b) {
  return crc32c_mulmod(crc32c_x8n(len_b), raw_a) ^ raw_b;
}
// The standard CRC32C of a message of `len` bytes from its raw register: the initial all-ones
// register contributes ~0·x^(8·len); then the final inversion.
KVR_LAYOUT_HD uint32_t crc32c_from_raw(uint32_t raw, uint64_t len) {
  return ~(raw ^ crc32c_mulmod(crc32c_x8n(len), 0xffffffffu));
}

}  // namespace kvr::chunk
