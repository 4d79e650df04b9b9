// The host ("copy path") snapshot chunk codec behind Backend::export_chunk / import_chunk's
// default (backend.cpp), built on the backend's kv_read / kv_write and the host quantizers and
// CRC32C, producing exactly the bytes tests/reference/chunk.ts encodeChunk writes. The CPU backend
// uses it as is; a device backend overrides both (native/src/cuda/codec.cu).
// Not the argument validation (snapshot_chunk.cpp) nor the container format (lib/snapshot).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/chunk_layout.h"
#include "core/backend.h"
#include "core/chunk_codec.h"
#include "core/errors.h"
#include "host/dtype.h"
#include "host/kv_quant.h"
#include "host/kv_values.h"

namespace kvr {
namespace {

using chunk::Layout;
using cpu::QuantAxis;

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // little-endian host (x86-64, aarch64)
}

void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

bool aligned4(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }

// Copies n floats from a possibly unaligned byte address.
void load_f32s(const uint8_t* p, size_t n, std::vector<float>& out) {
  out.resize(n);
  std::memcpy(out.data(), p, n * 4);
}

// Checks stored scales (>= 0, finite) and, for q4, mins (finite): the dequantizers' rules. Raises
// `bound` to the largest |decoded value| they allow: q8 |code·s| <= 128·s (codes -128..127), q4
// |min + code·s| <= |min| + 15·s (in double; the f32 rounding is covered by the caller's margin).
void check_scales(const char* what, uint32_t index, size_t layer, const uint8_t* scales, const uint8_t* mins,
                  size_t n, std::vector<float>& s, std::vector<float>& m, double& bound) {
  load_f32s(scales, n, s);
  for (size_t i = 0; i < n; ++i) {
    if (!(s[i] >= 0.0f && s[i] <= FLT_MAX))
      throw BackendError(KVR_ERR_CORRUPT, format("chunk %u layer %zu %s: scale %zu is %g (must be finite and >= 0)",
                                                 index, layer, what, i, static_cast<double>(s[i])));
  }
  if (mins == nullptr) {
    for (size_t i = 0; i < n; ++i) bound = std::max(bound, 128.0 * s[i]);
    return;
  }
  load_f32s(mins, n, m);
  for (size_t i = 0; i < n; ++i) {
    if (!(std::fabs(m[i]) <= FLT_MAX))
      throw BackendError(KVR_ERR_CORRUPT, format("chunk %u layer %zu %s: min %zu is %g (must be finite)", index,
                                                 layer, what, i, static_cast<double>(m[i])));
    bound = std::max(bound, std::fabs(static_cast<double>(m[i])) + 15.0 * s[i]);
  }
}

// Quantizes one f32 block x (heads, tokens, dim) into the frame block at `block`.
void encode_block(const Layout& L, bool is_k, const float* x, uint8_t* block, uint32_t index, size_t layer,
                  std::vector<float>& s, std::vector<float>& m) {
  const QuantAxis axis = is_k ? QuantAxis::PerChannel : QuantAxis::PerToken;
  if (!cpu::all_finite(x, L.n()))
    throw BackendError(KVR_ERR_INVALID_ARGUMENT,
                       format("chunk %u layer %zu: %s holds NaN or infinity (%s needs finite KV)", index, layer,
                              is_k ? "K" : "V", L.encoding == chunk::kEncQ8 ? "q8" : "q4"));
  if (L.encoding == chunk::kEncQ8) {
    const size_t ns = is_k ? L.q8_k_scales() : L.q8_v_scales();
    s.resize(ns);
    cpu::quantize_q8(x, L.heads, L.tokens, L.dim, axis,
                     reinterpret_cast<int8_t*>(block + (is_k ? L.q8_k_codes() : L.q8_v_codes())), s.data());
    std::memcpy(block, s.data(), ns * 4);
    return;
  }
  const size_t ng = is_k ? L.q4_k_groups() : L.q4_v_groups();
  s.resize(ng);
  m.resize(ng);
  cpu::quantize_q4(x, L.heads, L.tokens, L.dim, axis, L.group, block + (is_k ? L.q4_k_codes() : L.q4_v_codes()),
                   s.data(), m.data());
  if (!cpu::all_finite(s.data(), ng))  // max - min overflowed f32 (values near ±FLT_MAX)
    throw BackendError(KVR_ERR_INVALID_ARGUMENT,
                       format("chunk %u layer %zu: a q4 group's range max - min overflows f32", index, layer));
  std::memcpy(block, s.data(), ng * 4);
  std::memcpy(block + (is_k ? L.q4_k_mins() : L.q4_v_mins()), m.data(), ng * 4);
}

// Dequantizes the frame block at `block` (scales already checked) into x (heads, tokens, dim).
void decode_block(const Layout& L, bool is_k, const uint8_t* block, float* x, std::vector<float>& s,
                  std::vector<float>& m) {
  const QuantAxis axis = is_k ? QuantAxis::PerChannel : QuantAxis::PerToken;
  if (L.encoding == chunk::kEncQ8) {
    load_f32s(block, is_k ? L.q8_k_scales() : L.q8_v_scales(), s);
    cpu::dequantize_q8(reinterpret_cast<const int8_t*>(block + (is_k ? L.q8_k_codes() : L.q8_v_codes())), s.data(),
                       L.heads, L.tokens, L.dim, axis, x);
    return;
  }
  const size_t ng = is_k ? L.q4_k_groups() : L.q4_v_groups();
  load_f32s(block, ng, s);
  load_f32s(block + (is_k ? L.q4_k_mins() : L.q4_v_mins()), ng, m);
  cpu::dequantize_q4(block + (is_k ? L.q4_k_codes() : L.q4_v_codes()), s.data(), m.data(), L.heads, L.tokens, L.dim,
                     axis, L.group, x);
}

// The exact per-element check, with the message naming the first refused element: what the
// whole-block forms (kv_values.h) fall back to when they cannot vouch for a block.
void check_block_values(const float* x, const ChunkSpec& c, size_t layer, bool is_v) {
  const Layout& L = c.layout;
  for (size_t i = 0; i < L.n(); ++i) {
    if (value_fault(x[i], c.cache_dtype)[0] == 0) continue;
    throw BackendError(KVR_ERR_CORRUPT, value_fault_message(x[i], c.cache_dtype, c.index, layer, is_v, i, L.tokens,
                                                            L.dim, c.start));
  }
}

// Widens a lossless block (n elements of the encoding's type, any alignment) to f32.
void widen_block(const uint8_t* p, size_t n, uint32_t encoding, std::vector<float>& out) {
  out.resize(n);
  const size_t es = encoding == KVR_DTYPE_F32 ? 4 : 2;
  for (size_t i = 0; i < n; ++i) out[i] = load_as_f32(p + i * es, encoding);
}

}  // namespace

void host_export_chunk(const Backend& b, const SeqState& s, const ChunkSpec& c, uint8_t* frame, size_t frame_len) {
  const Layout& L = c.layout;
  const uint32_t T = static_cast<uint32_t>(L.tokens);
  store_u32(frame, c.index);
  store_u32(frame + 4, T);
  if (L.lossless()) {
    // The frame's blocks are exactly kv_read's (kv_heads, T, head_dim) layout in the encoding's
    // type: read straight into the frame when the address suits the element type.
    const size_t bytes = L.k_block_bytes();
    std::vector<uint8_t> kb, vb;
    for (size_t l = 0; l < L.layers; ++l) {
      uint8_t* k = frame + L.k_offset(l);
      uint8_t* v = frame + L.v_offset(l);
      if (aligned4(k) && aligned4(v)) {
        b.kv_read(s, static_cast<uint32_t>(l), c.start, T, L.encoding, k, v);
      } else {
        kb.resize(bytes);
        vb.resize(bytes);
        b.kv_read(s, static_cast<uint32_t>(l), c.start, T, L.encoding, kb.data(), vb.data());
        std::memcpy(k, kb.data(), bytes);
        std::memcpy(v, vb.data(), bytes);
      }
    }
  } else {
    std::vector<float> kf(L.n()), vf(L.n()), sc, mn;
    for (size_t l = 0; l < L.layers; ++l) {
      b.kv_read(s, static_cast<uint32_t>(l), c.start, T, KVR_DTYPE_F32, kf.data(), vf.data());
      encode_block(L, true, kf.data(), frame + L.k_offset(l), c.index, l, sc, mn);
      encode_block(L, false, vf.data(), frame + L.v_offset(l), c.index, l, sc, mn);
    }
  }
  const size_t body = frame_len - chunk::kFrameCrcBytes;
  store_u32(frame + body, cpu::crc32c(frame, body, 0));
}

void host_import_chunk(const Backend& b, SeqState& s, const ChunkSpec& c, const uint8_t* frame, size_t frame_len) {
  const Layout& L = c.layout;
  const uint32_t T = static_cast<uint32_t>(L.tokens);
  const size_t body = frame_len - chunk::kFrameCrcBytes;
  const uint32_t stored = load_u32(frame + body), crc = cpu::crc32c(frame, body, 0);
  if (stored != crc)
    throw BackendError(KVR_ERR_CHECKSUM, format("chunk %u checksum mismatch: stored crc32c 0x%x, computed 0x%x",
                                                c.index, stored, crc));
  const uint32_t got_index = load_u32(frame), got_tokens = load_u32(frame + 4);
  if (got_index != c.index || got_tokens != T)
    throw BackendError(KVR_ERR_CORRUPT,
                       format("chunk frame says index %u/%u tokens where the table expects %u/%u", got_index,
                              got_tokens, c.index, T));
  if (L.lossless()) {
    // Values first (nothing is written unless every value of every layer is acceptable): a scan of
    // magnitude bits per block; the exact widened check only for a block the scan refuses, so the
    // message names the element.
    const uint32_t limit = fault_bits(L.encoding, c.cache_dtype);
    std::vector<float> w;
    for (size_t l = 0; l < L.layers; ++l) {
      for (const bool is_k : {true, false}) {
        const uint8_t* block = frame + (is_k ? L.k_offset(l) : L.v_offset(l));
        if (block_accepted(block, L.n(), L.encoding, limit)) continue;
        widen_block(block, L.n(), L.encoding, w);
        check_block_values(w.data(), c, l, !is_k);
      }
    }
    const size_t bytes = L.k_block_bytes();
    std::vector<uint8_t> kb, vb;
    for (size_t l = 0; l < L.layers; ++l) {
      const uint8_t* k = frame + L.k_offset(l);
      const uint8_t* v = frame + L.v_offset(l);
      if (!aligned4(k) || !aligned4(v)) {
        kb.assign(k, k + bytes);
        vb.assign(v, v + bytes);
        k = kb.data();
        v = vb.data();
      }
      b.kv_write(s, static_cast<uint32_t>(l), c.start, T, L.encoding, k, v);
    }
    return;
  }
  // Every scale of the chunk is checked before any layer is written (a corrupt chunk leaves the
  // cache as it was, as the reference decoder that decodes the whole chunk first does).
  std::vector<float> sc, mn;
  const bool q8 = L.encoding == chunk::kEncQ8;
  double bound = 0.0;
  for (size_t l = 0; l < L.layers; ++l) {
    const uint8_t* kb = frame + L.k_offset(l);
    const uint8_t* vb = frame + L.v_offset(l);
    if (q8) {
      check_scales("K", c.index, l, kb, nullptr, L.q8_k_scales(), sc, mn, bound);
      check_scales("V", c.index, l, vb, nullptr, L.q8_v_scales(), sc, mn, bound);
    } else {
      check_scales("K", c.index, l, kb, kb + L.q4_k_mins(), L.q4_k_groups(), sc, mn, bound);
      check_scales("V", c.index, l, vb, vb + L.q4_v_mins(), L.q4_v_groups(), sc, mn, bound);
    }
  }
  std::vector<float> kf(L.n()), vf(L.n());
  // Decoded values next, when the scales cannot vouch for them (a huge finite scale can overflow
  // f32 or the cache type): then the chunk is decoded twice rather than held whole. The margin
  // 2^-20 covers the f32 roundings of code·s and min + code·s (2^-24 each) with room to spare.
  if (bound * (1.0 + 0x1p-20) > accepted_magnitude(c.cache_dtype)) {
    for (size_t l = 0; l < L.layers; ++l) {
      decode_block(L, true, frame + L.k_offset(l), kf.data(), sc, mn);
      check_block_values(kf.data(), c, l, false);
      decode_block(L, false, frame + L.v_offset(l), vf.data(), sc, mn);
      check_block_values(vf.data(), c, l, true);
    }
  }
  for (size_t l = 0; l < L.layers; ++l) {
    decode_block(L, true, frame + L.k_offset(l), kf.data(), sc, mn);
    decode_block(L, false, frame + L.v_offset(l), vf.data(), sc, mn);
    b.kv_write(s, static_cast<uint32_t>(l), c.start, T, KVR_DTYPE_F32, kf.data(), vf.data());
  }
}

}  // namespace kvr
