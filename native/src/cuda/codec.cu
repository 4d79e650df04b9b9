// The snapshot chunk codec on the device (docs/gpu-handoff.md): encode a token range of the KV
// cache into the frame layout of docs/snapshot-format.md (f32/f16/bf16 lossless, q8, q4), the
// frame's CRC32C as per-piece raw registers combined (common/chunk_layout.h), scale checks and
// decoding back into the cache. Bytes equal the CPU codec's (host/kv_quant.cpp): the same f32
// operations in the same order, uncontracted (dm::fmul/fadd/...), the same min/max tie rules.
// Not the host orchestration (codec_host.cpp).
#include <cfloat>
#include <cstdint>

#include "common/chunk_layout.h"
#include "common/device_math.h"
#include "cuda/common.cuh"
#include "cuda/handoff.h"
#include "host/kv_values.h"

namespace kvr::cuda {
namespace {

using chunk::Layout;

constexpr int kThreads = 256;

__device__ __forceinline__ const uint8_t* plane(const DevKv& kv, size_t layer, int part) {
  const size_t es = kv.kv_dtype == 0 ? 4 : 2;
  return kv.base + (2 * layer + part) * kv.heads * kv.capacity * kv.dim * es;
}

__device__ __forceinline__ float load_elem(const uint8_t* p, uint32_t dtype, size_t i) {
  if (dtype == 0) return reinterpret_cast<const float*>(p)[i];
  const uint16_t h = reinterpret_cast<const uint16_t*>(p)[i];
  return dtype == 2 ? dm::bf16_to_f32(h) : dm::f16_to_f32(h);
}

// Stores into a frame at any byte offset (frame blocks need not be 4-aligned: q8/q4 blocks hold
// odd byte counts).
__device__ __forceinline__ void store_f32_bytes(uint8_t* p, float v) {
  const uint32_t u = __float_as_uint(v);
  p[0] = static_cast<uint8_t>(u);
  p[1] = static_cast<uint8_t>(u >> 8);
  p[2] = static_cast<uint8_t>(u >> 16);
  p[3] = static_cast<uint8_t>(u >> 24);
}
__device__ __forceinline__ float load_f32_bytes(const uint8_t* p) {
  return __uint_as_float(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24));
}

__device__ __forceinline__ bool finite(float x) { return fabsf(x) <= FLT_MAX; }
// std::max / std::min exactly (the first argument wins unless the second is strictly beyond).
__device__ __forceinline__ float smax(float a, float b) { return a < b ? b : a; }
__device__ __forceinline__ float smin(float a, float b) { return b < a ? b : a; }
__device__ __forceinline__ float scale_or_zero(float s) { return s >= FLT_MIN ? s : 0.0f; }
__device__ __forceinline__ float inverse(float s) { return s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f; }
// host/kv_quant.cpp round_even: (v + 1.5·2^23) − 1.5·2^23 in f32, never contracted.
__device__ __forceinline__ float round_even(float v) {
  constexpr float kMagic = 12582912.0f;
  return dm::fsub(dm::fadd(v, kMagic), kMagic);
}
__device__ __forceinline__ int8_t q8_code(float x, float inv) {
  const float r = round_even(dm::fmul(x, inv));
  return static_cast<int8_t>(fminf(127.0f, fmaxf(-127.0f, r)));
}
__device__ __forceinline__ uint8_t q4_code(float x, float m, float inv) {
  const float r = round_even(dm::fmul(dm::fsub(x, m), inv));
  return static_cast<uint8_t>(fminf(15.0f, fmaxf(0.0f, r)));
}

// ---- lossless: one thread per element of layers [l0, l1) × {K, V} × (H, T, D) ----
__global__ void encode_lossless(DevKv kv, Layout L, uint32_t start, size_t l0, size_t l1, uint8_t* frame) {
  const size_t n = L.n(), per_layer = 2 * n, total = (l1 - l0) * per_layer;
  const size_t es = L.elem_bytes();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t l = l0 + i / per_layer, r = i % per_layer;
    const int part = r >= n ? 1 : 0;
    const size_t e = r - part * n;  // (h, t, d) in the block
    const size_t d = e % L.dim, t = (e / L.dim) % L.tokens, h = e / (L.dim * L.tokens);
    const size_t src = (h * kv.capacity + start + t) * kv.dim + d;
    uint8_t* dst = frame + (part ? L.v_offset(l) : L.k_offset(l)) + e * es;
    const uint8_t* p = plane(kv, l, part);
    if (L.encoding == kv.kv_dtype) {  // the cache's own type: its bits, NaN payloads included
      if (es == 4) {
        const uint32_t u = reinterpret_cast<const uint32_t*>(p)[src];
        for (int b = 0; b < 4; ++b) dst[b] = static_cast<uint8_t>(u >> (8 * b));
      } else {
        const uint16_t u = reinterpret_cast<const uint16_t*>(p)[src];
        dst[0] = static_cast<uint8_t>(u);
        dst[1] = static_cast<uint8_t>(u >> 8);
      }
      continue;
    }
    const float x = load_elem(p, kv.kv_dtype, src);
    if (L.encoding == chunk::kEncF32) {
      store_f32_bytes(dst, x);
    } else {
      const uint16_t u = L.encoding == chunk::kEncBf16 ? dm::f32_to_bf16(x) : dm::f32_to_f16(x);
      dst[0] = static_cast<uint8_t>(u);
      dst[1] = static_cast<uint8_t>(u >> 8);
    }
  }
}

// ---- q8 keys: one thread per (layer, head, channel): absmax over the chunk's tokens ----
__global__ void encode_q8_k(DevKv kv, Layout L, uint32_t start, size_t l0, size_t l1, uint8_t* frame,
                            uint32_t* bad) {
  const size_t per_layer = L.heads * L.dim, total = (l1 - l0) * per_layer;
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const size_t l = l0 + i / per_layer, hd = i % per_layer, h = hd / L.dim, d = hd % L.dim;
  const uint8_t* p = plane(kv, l, 0);
  const size_t row0 = (h * kv.capacity + start) * kv.dim + d;
  float s = 0.0f;
  bool ok = true;
  for (size_t t = 0; t < L.tokens; ++t) {
    const float x = load_elem(p, kv.kv_dtype, row0 + t * kv.dim);
    ok &= finite(x);
    s = smax(s, fabsf(x));
  }
  if (!ok) atomicMin(bad, static_cast<uint32_t>(2 * l));
  s = scale_or_zero(__fdiv_rn(s, 127.0f));
  uint8_t* block = frame + L.k_offset(l);
  store_f32_bytes(block + 4 * hd, s);
  const float inv = inverse(s);
  int8_t* codes = reinterpret_cast<int8_t*>(block + L.q8_k_codes());
  for (size_t t = 0; t < L.tokens; ++t)
    codes[(h * L.tokens + t) * L.dim + d] = q8_code(load_elem(p, kv.kv_dtype, row0 + t * kv.dim), inv);
}

// ---- q8 values: one warp per (layer, head, token): absmax over head_dim (max is exact in any
// order), then the lanes write the codes ----
__global__ void encode_q8_v(DevKv kv, Layout L, uint32_t start, size_t l0, size_t l1, uint8_t* frame,
                            uint32_t* bad) {
  const size_t warp = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  const size_t per_layer = L.heads * L.tokens, total = (l1 - l0) * per_layer;
  if (warp >= total) return;  // whole warps exit together
  const size_t l = l0 + warp / per_layer, r = warp % per_layer, h = r / L.tokens, t = r % L.tokens;
  const uint8_t* p = plane(kv, l, 1);
  const size_t row = (h * kv.capacity + start + t) * kv.dim;
  float amax = 0.0f;
  bool ok = true;
  for (size_t d = lane; d < L.dim; d += 32) {
    const float x = load_elem(p, kv.kv_dtype, row + d);
    ok &= finite(x);
    amax = smax(amax, fabsf(x));
  }
  for (int o = 16; o > 0; o >>= 1) amax = smax(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  ok = __all_sync(0xffffffffu, ok);
  if (!ok && lane == 0) atomicMin(bad, static_cast<uint32_t>(2 * l + 1));
  const float s = scale_or_zero(__fdiv_rn(amax, 127.0f));
  uint8_t* block = frame + L.v_offset(l);
  if (lane == 0) store_f32_bytes(block + 4 * r, s);
  const float inv = inverse(s);
  int8_t* codes = reinterpret_cast<int8_t*>(block + L.q8_v_codes());
  for (size_t d = lane; d < L.dim; d += 32) codes[r * L.dim + d] = q8_code(load_elem(p, kv.kv_dtype, row + d), inv);
}

// ---- q4 statistics: one thread per group: keys (layer, head, token-group, channel), values
// (layer, head, token, channel-group); min/max folded in the CPU's element order ----
__global__ void encode_q4_stats(DevKv kv, Layout L, uint32_t start, size_t l0, size_t l1, uint8_t* frame,
                                uint32_t* bad, int part) {
  const size_t ng = part == 0 ? L.q4_k_groups() : L.q4_v_groups(), total = (l1 - l0) * ng;
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const size_t l = l0 + i / ng, gi = i % ng;
  const uint8_t* p = plane(kv, l, part);
  size_t first, step, count;  // cache element index of the group's first element, stride, length
  if (part == 0) {
    const size_t tg = (L.tokens + L.group - 1) / L.group;
    const size_t d = gi % L.dim, g = (gi / L.dim) % tg, h = gi / (L.dim * tg);
    const size_t t0 = g * L.group, t1 = t0 + L.group < L.tokens ? t0 + L.group : L.tokens;
    first = (h * kv.capacity + start + t0) * kv.dim + d;
    step = kv.dim;
    count = t1 - t0;
  } else {
    const size_t dg = (L.dim + L.group - 1) / L.group;
    const size_t g = gi % dg, t = (gi / dg) % L.tokens, h = gi / (dg * L.tokens);
    const size_t d0 = g * L.group, d1 = d0 + L.group < L.dim ? d0 + L.group : L.dim;
    first = (h * kv.capacity + start + t) * kv.dim + d0;
    step = 1;
    count = d1 - d0;
  }
  float lo = load_elem(p, kv.kv_dtype, first), hi = lo;
  bool ok = finite(lo);
  for (size_t j = 1; j < count; ++j) {
    const float x = load_elem(p, kv.kv_dtype, first + j * step);
    ok &= finite(x);
    lo = smin(lo, x);
    hi = smax(hi, x);
  }
  const float range = dm::fsub(hi, lo);
  // an infinite range (values near ±FLT_MAX) is refused like a non-finite input
  if (!ok || !finite(range)) atomicMin(bad, static_cast<uint32_t>(2 * l + part));
  const float s = scale_or_zero(__fdiv_rn(range, 15.0f));
  uint8_t* block = frame + (part == 0 ? L.k_offset(l) : L.v_offset(l));
  store_f32_bytes(block + 4 * gi, s);
  store_f32_bytes(block + (part == 0 ? L.q4_k_mins() : L.q4_v_mins()) + 4 * gi, lo);
}

// ---- q4 codes: one thread per code byte (elements 2i, 2i+1 of the flat (H, T, D) block) ----
__device__ __forceinline__ size_t q4_group_of(const Layout& L, int part, size_t e) {
  const size_t d = e % L.dim, t = (e / L.dim) % L.tokens, h = e / (L.dim * L.tokens);
  if (part == 0) {
    const size_t tg = (L.tokens + L.group - 1) / L.group;
    return (h * tg + t / L.group) * L.dim + d;
  }
  const size_t dg = (L.dim + L.group - 1) / L.group;
  return (h * L.tokens + t) * dg + d / L.group;
}

__global__ void encode_q4_codes(DevKv kv, Layout L, uint32_t start, size_t l0, size_t l1, uint8_t* frame, int part) {
  const size_t n = L.n(), nb = (n + 1) / 2, total = (l1 - l0) * nb;
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const size_t l = l0 + i / nb, b = i % nb;
  const uint8_t* p = plane(kv, l, part);
  uint8_t* block = frame + (part == 0 ? L.k_offset(l) : L.v_offset(l));
  const uint8_t* mins = block + (part == 0 ? L.q4_k_mins() : L.q4_v_mins());
  uint8_t byte = 0;
  for (int half = 0; half < 2; ++half) {
    const size_t e = 2 * b + half;
    if (e >= n) break;  // odd tail: high nibble 0
    const size_t g = q4_group_of(L, part, e);
    const size_t d = e % L.dim, t = (e / L.dim) % L.tokens, h = e / (L.dim * L.tokens);
    const float x = load_elem(p, kv.kv_dtype, (h * kv.capacity + start + t) * kv.dim + d);
    const float s = load_f32_bytes(block + 4 * g), m = load_f32_bytes(mins + 4 * g);
    byte |= static_cast<uint8_t>(q4_code(x, m, inverse(s)) << (4 * half));
  }
  block[(part == 0 ? L.q4_k_codes() : L.q4_v_codes()) + b] = byte;
}

// ---- CRC32C: a raw register per piece (slice-by-4 tables in shared memory), then one block
// combines the pieces (each thread a run, then a tree) ----
__global__ void crc_pieces(const uint8_t* data, size_t len, uint32_t* raw) {
  __shared__ uint32_t tab[4][256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    uint32_t c = static_cast<uint32_t>(i);
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    tab[0][i] = c;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    uint32_t c = tab[0][i];
    for (int k = 1; k < 4; ++k) {
      c = (c >> 8) ^ tab[0][c & 0xffu];
      tab[k][i] = c;
    }
  }
  __syncthreads();
  const size_t pieces = (len + kCrcPiece - 1) / kCrcPiece;
  const size_t piece = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (piece >= pieces) return;
  const size_t o = piece * kCrcPiece, end = o + kCrcPiece < len ? o + kCrcPiece : len;
  uint32_t c = 0;
  size_t i = o;
  // pieces start 1024-aligned from a 256-aligned buffer: whole words until the ragged end
  for (; i + 4 <= end; i += 4) {
    c ^= *reinterpret_cast<const uint32_t*>(data + i);
    c = tab[3][c & 0xffu] ^ tab[2][(c >> 8) & 0xffu] ^ tab[1][(c >> 16) & 0xffu] ^ tab[0][c >> 24];
  }
  for (; i < end; ++i) c = tab[0][(c ^ data[i]) & 0xffu] ^ (c >> 8);
  raw[piece] = c;
}

constexpr int kReduceThreads = 1024;

__global__ void crc_reduce(const uint32_t* raw, size_t len, uint32_t* out, uint8_t* store_at) {
  __shared__ uint32_t acc[kReduceThreads];
  __shared__ unsigned long long acc_len[kReduceThreads];
  const size_t pieces = (len + kCrcPiece - 1) / kCrcPiece;
  const size_t run = (pieces + kReduceThreads - 1) / kReduceThreads;
  const size_t p0 = threadIdx.x * run, p1 = p0 + run < pieces ? p0 + run : pieces;
  const uint32_t x_piece = chunk::crc32c_x8n(kCrcPiece);
  uint32_t c = 0;
  unsigned long long bytes = 0;
  for (size_t p = p0; p < p1; ++p) {
    const size_t plen = p + 1 == pieces ? len - p * kCrcPiece : kCrcPiece;
    c = chunk::crc32c_mulmod(plen == kCrcPiece ? x_piece : chunk::crc32c_x8n(plen), c) ^ raw[p];
    bytes += plen;
  }
  acc[threadIdx.x] = c;
  acc_len[threadIdx.x] = bytes;
  __syncthreads();
  for (int stride = 1; stride < kReduceThreads; stride *= 2) {
    const int i = threadIdx.x;
    if (i % (2 * stride) == 0 && i + stride < kReduceThreads && acc_len[i + stride] > 0) {
      acc[i] = chunk::crc32c_raw_combine(acc[i], acc[i + stride], acc_len[i + stride]);
      acc_len[i] += acc_len[i + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const uint32_t crc = chunk::crc32c_from_raw(acc[0], len);
    *out = crc;
    if (store_at)
      for (int b = 0; b < 4; ++b) store_at[b] = static_cast<uint8_t>(crc >> (8 * b));
  }
}

// ---- decode checks and decoding ----
__global__ void check_scales(Layout L, const uint8_t* frame, unsigned long long* bad_key) {
  const bool q8 = L.encoding == chunk::kEncQ8;
  const size_t nk = q8 ? L.q8_k_scales() : L.q4_k_groups(), nv = q8 ? L.q8_v_scales() : L.q4_v_groups();
  const size_t per_layer = q8 ? nk + nv : 2 * (nk + nv), total = L.layers * per_layer;
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const size_t l = i / per_layer;
  size_t r = i % per_layer;
  int part = 0, is_min = 0;
  size_t count = nk;
  if (q8) {
    if (r >= nk) part = 1, r -= nk;
  } else {
    // order within a layer: K scales, K mins, V scales, V mins
    if (r >= 2 * nk) part = 1, r -= 2 * nk, count = nv;
    if (r >= count) is_min = 1, r -= count;
  }
  const uint8_t* block = frame + (part ? L.v_offset(l) : L.k_offset(l));
  const size_t min_off = part ? L.q4_v_mins() : L.q4_k_mins();
  const float v = load_f32_bytes(block + (is_min ? min_off : 0) + 4 * r);
  const bool ok = is_min ? fabsf(v) <= FLT_MAX : (v >= 0.0f && v <= FLT_MAX);
  if (!ok) {
    const unsigned long long key =
        (static_cast<unsigned long long>((2 * l + part) * 2 + is_min) << 32) | static_cast<unsigned long long>(r);
    atomicMin(bad_key, key);
  }
}

// The value a decoded element takes (before rounding to the cache type); frame checked.
__device__ __forceinline__ float decoded_value(const Layout& L, const uint8_t* frame, size_t l, int part, size_t e) {
  const uint8_t* block = frame + (part ? L.v_offset(l) : L.k_offset(l));
  const size_t d = e % L.dim, t = (e / L.dim) % L.tokens, h = e / (L.dim * L.tokens);
  if (L.lossless()) {
    const uint8_t* src = block + e * L.elem_bytes();
    if (L.elem_bytes() == 4) return load_f32_bytes(src);
    const uint16_t u = static_cast<uint16_t>(src[0] | (src[1] << 8));
    return L.encoding == chunk::kEncBf16 ? dm::bf16_to_f32(u) : dm::f16_to_f32(u);
  }
  if (L.encoding == chunk::kEncQ8) {
    const size_t si = part ? h * L.tokens + t : h * L.dim + d;
    const int8_t code = reinterpret_cast<const int8_t*>(block + (part ? L.q8_v_codes() : L.q8_k_codes()))[e];
    return dm::fmul(static_cast<float>(code), load_f32_bytes(block + 4 * si));
  }
  const size_t g = q4_group_of(L, part, e);
  const uint8_t byte = block[(part ? L.q4_v_codes() : L.q4_k_codes()) + e / 2];
  const uint8_t code = (e & 1) ? byte >> 4 : byte & 0x0f;
  const float s = load_f32_bytes(block + 4 * g);
  const float m = load_f32_bytes(block + (part ? L.q4_v_mins() : L.q4_k_mins()) + 4 * g);
  return dm::fadd(m, dm::fmul(static_cast<float>(code), s));
}

__device__ __forceinline__ void store_cache(uint8_t* p, uint32_t dtype, size_t i, float x) {
  if (dtype == 0) reinterpret_cast<float*>(p)[i] = x;
  else reinterpret_cast<uint16_t*>(p)[i] = dtype == 2 ? dm::f32_to_bf16(x) : dm::f32_to_f16(x);
}

__global__ void decode_chunk(DevKv kv, Layout L, uint32_t start, const uint8_t* frame) {
  const size_t n = L.n(), per_layer = 2 * n, total = L.layers * per_layer;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t l = i / per_layer, r = i % per_layer;
    const int part = r >= n ? 1 : 0;
    const size_t e = r - part * n;
    const size_t d = e % L.dim, t = (e / L.dim) % L.tokens, h = e / (L.dim * L.tokens);
    uint8_t* p = const_cast<uint8_t*>(plane(kv, l, part));
    const size_t dst = (h * kv.capacity + start + t) * kv.dim + d;
    const uint8_t* block = frame + (part ? L.v_offset(l) : L.k_offset(l));
    if (L.lossless()) {
      const size_t es = L.elem_bytes();
      const uint8_t* src = block + e * es;
      if (L.encoding == kv.kv_dtype) {  // bit copy
        if (es == 4) reinterpret_cast<float*>(p)[dst] = load_f32_bytes(src);
        else reinterpret_cast<uint16_t*>(p)[dst] = static_cast<uint16_t>(src[0] | (src[1] << 8));
        continue;
      }
    }
    store_cache(p, kv.kv_dtype, dst, decoded_value(L, frame, l, part, e));
  }
}

// Every decoded value finite, within kKvMaxAbs (kv_values.h: the host rule, value_fault) and still
// finite once rounded to the cache type; the first bad one
// in (layer, K before V, element) order lowers *bad_key to ((2·layer + part) << 32) | element.
__global__ void check_values(Layout L, uint32_t cache_dtype, const uint8_t* frame, unsigned long long* bad_key) {
  const size_t n = L.n(), per_layer = 2 * n, total = L.layers * per_layer;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t l = i / per_layer, r = i % per_layer;
    const int part = r >= n ? 1 : 0;
    const size_t e = r - part * n;
    const float x = decoded_value(L, frame, l, part, e);
    bool ok = finite(x) && fabsf(x) <= kKvMaxAbs;
    if (cache_dtype == 2) ok &= (dm::f32_to_bf16(x) & 0x7f80u) != 0x7f80u;
    if (cache_dtype == 1) ok &= (dm::f32_to_f16(x) & 0x7c00u) != 0x7c00u;
    if (!ok) atomicMin(bad_key, (static_cast<unsigned long long>(2 * l + part) << 32) | e);
  }
}

unsigned grid_for(size_t items, int threads) {
  const size_t blocks = (items + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535u * 32u ? (blocks == 0 ? 1 : blocks) : 65535u * 32u);
}

}  // namespace

cudaError_t launch_encode_layers(const DevKv& kv, const Layout& L, uint32_t start, size_t l0, size_t l1,
                                 uint8_t* d_frame, uint32_t* d_bad, cudaStream_t stream) {
  if (l1 <= l0) return cudaSuccess;
  const size_t nl = l1 - l0;
  if (L.lossless()) {
    encode_lossless<<<grid_for(nl * 2 * L.n(), kThreads), kThreads, 0, stream>>>(kv, L, start, l0, l1, d_frame);
  } else if (L.encoding == chunk::kEncQ8) {
    encode_q8_k<<<grid_for(nl * L.heads * L.dim, kThreads), kThreads, 0, stream>>>(kv, L, start, l0, l1, d_frame,
                                                                                    d_bad);
    encode_q8_v<<<grid_for(nl * L.heads * L.tokens * 32, kThreads), kThreads, 0, stream>>>(kv, L, start, l0, l1,
                                                                                             d_frame, d_bad);
  } else {
    for (int part = 0; part < 2; ++part) {
      const size_t ng = part == 0 ? L.q4_k_groups() : L.q4_v_groups();
      encode_q4_stats<<<grid_for(nl * ng, kThreads), kThreads, 0, stream>>>(kv, L, start, l0, l1, d_frame, d_bad,
                                                                             part);
      encode_q4_codes<<<grid_for(nl * ((L.n() + 1) / 2), kThreads), kThreads, 0, stream>>>(kv, L, start, l0, l1,
                                                                                            d_frame, part);
    }
  }
  return cudaGetLastError();
}

cudaError_t launch_crc32c(const uint8_t* d_data, size_t len, uint32_t* d_raw, uint32_t* d_crc, bool store_at_end,
                          cudaStream_t stream) {
  const size_t pieces = (len + kCrcPiece - 1) / kCrcPiece;
  if (pieces > 0) crc_pieces<<<grid_for(pieces, kThreads), kThreads, 0, stream>>>(d_data, len, d_raw);
  crc_reduce<<<1, kReduceThreads, 0, stream>>>(d_raw, len, d_crc,
                                               store_at_end ? const_cast<uint8_t*>(d_data) + len : nullptr);
  return cudaGetLastError();
}

cudaError_t launch_check_values(const Layout& L, uint32_t cache_dtype, const uint8_t* d_frame,
                                unsigned long long* d_bad_key, cudaStream_t stream) {
  check_values<<<grid_for(L.layers * 2 * L.n(), kThreads), kThreads, 0, stream>>>(L, cache_dtype, d_frame, d_bad_key);
  return cudaGetLastError();
}

cudaError_t launch_check_scales(const Layout& L, const uint8_t* d_frame, unsigned long long* d_bad_key,
                                cudaStream_t stream) {
  if (L.lossless()) return cudaSuccess;
  const bool q8 = L.encoding == chunk::kEncQ8;
  const size_t per_layer =
      q8 ? L.q8_k_scales() + L.q8_v_scales() : 2 * (L.q4_k_groups() + L.q4_v_groups());
  check_scales<<<grid_for(L.layers * per_layer, kThreads), kThreads, 0, stream>>>(L, d_frame, d_bad_key);
  return cudaGetLastError();
}

cudaError_t launch_decode_chunk(const DevKv& kv, const Layout& L, uint32_t start, const uint8_t* d_frame,
                                cudaStream_t stream) {
  decode_chunk<<<grid_for(L.layers * 2 * L.n(), kThreads), kThreads, 0, stream>>>(kv, L, start, d_frame);
  return cudaGetLastError();
}

}  // namespace kvr::cuda
