// q8 weight kernels (see gemm_q8.h): the activation quantizer, the portable integer GEMV and its
// AVX-512 VNNI, AVX-VNNI and AVX2 twins (compiled per function with target attributes; chosen once
// from cpu_features.h; all give the same exact int32 block dots, so the same bits), and the slice
// dequantizer (dequantize(), tied-embedding rows).
#include "host/gemm_q8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "host/cpu_features.h"
#include "host/gemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVR_Q8_AVX512 1
#define KVR_TARGET_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))
#define KVR_TARGET_AVX2_Q __attribute__((target("avx2,fma,f16c")))
#define KVR_TARGET_AVX_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#else
#define KVR_Q8_AVX512 0
#endif

namespace kvr::cpu::q8 {
namespace {

constexpr size_t kB = PackedWeight::kQ8Block;  // 32

// bf16 scale → f32 (exact: the upper 16 bits).
inline float bf16_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// acc (16·np) = per-column Σ over blocks of fma(dx[b]·scale, int dot, ·), np panels whose data
// start at codes/scale with the layout's strides between panels; xoff[b] = −128·Σq of block b.
using GemvFn = void (*)(size_t blocks, const int8_t* xq, const float* dx, const int32_t* xoff,
                        const uint8_t* codes, const uint16_t* scale, size_t np, float* acc);

void gemv_generic(size_t blocks, const int8_t* xq, const float* dx, const int32_t* xoff,
                  const uint8_t* codes, const uint16_t* scale, size_t np, float* acc) {
  for (size_t q = 0; q < np; ++q) {
    const uint8_t* cq = codes + q * blocks * 512;
    const uint16_t* sq = scale + q * blocks * 16;
    float a[16] = {};
    for (size_t b = 0; b < blocks; ++b) {
      int32_t s[16];
      for (int c = 0; c < 16; ++c) s[c] = xoff[b];
      const int8_t* xb = xq + b * kB;
      const uint8_t* wb = cq + b * 512;
      for (int g = 0; g < 8; ++g)
        for (int c = 0; c < 16; ++c)
          for (int e = 0; e < 4; ++e)
            s[c] += static_cast<int32_t>(xb[g * 4 + e]) * static_cast<int32_t>(wb[g * 64 + c * 4 + e]);
      for (int c = 0; c < 16; ++c)
        a[c] = std::fma(dx[b] * bf16_f32(sq[b * 16 + c]), static_cast<float>(s[c]), a[c]);
    }
    std::memcpy(acc + q * 16, a, sizeof a);
  }
}

#if KVR_Q8_AVX512
// int32 → f32 (exact here: |dot| < 2^24). The maskz form: GCC 12's plain _mm512_cvtepi32_ps
// passes an undefined vector that -Werror=maybe-uninitialized rejects (the same for the shifts
// and widenings below).
KVR_TARGET_AVX512_VNNI inline __m512 to_f32(__m512i v) { return _mm512_maskz_cvtepi32_ps(0xFFFF, v); }

// 16 bf16 scales → f32 (zero-extend, shift into the upper half).
KVR_TARGET_AVX512_VNNI inline __m512 scales16(const uint16_t* s) {
  const __m512i w = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, w, 16));
}

// 4 signed activation codes broadcast to every int32 lane.
KVR_TARGET_AVX512_VNNI inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// One panel's block dot: 8 vpdpbusd (unsigned weight codes × signed activation codes, 4 k-steps ×
// 16 columns each) in two chains, the first started at −128·Σq.
KVR_TARGET_AVX512_VNNI inline __m512i block_dot(const int8_t* xb, const uint8_t* wb, int32_t off) {
  __m512i s0 = _mm512_set1_epi32(off), s1 = _mm512_setzero_si512();
  for (int g = 0; g < 8; g += 2) {
    s0 = _mm512_dpbusd_epi32(s0, _mm512_load_si512(wb + g * 64), bcast4(xb + g * 4));
    s1 = _mm512_dpbusd_epi32(s1, _mm512_load_si512(wb + g * 64 + 64), bcast4(xb + g * 4 + 4));
  }
  return _mm512_add_epi32(s0, s1);
}

// Software prefetch of the stream one block ahead (512 B of codes, 32 B of scales): a decode GEMV
// streams weights once, and the hardware prefetcher alone left the kernel at 32 GB/s on 2 threads
// where it reads 35 GB/s with this (Qwen3-0.6B q8 weights, huge pages; docs/native.md "Decode
// step"). Prefetches never fault, so reading past the weight's last block is harmless.
KVR_TARGET_AVX512_VNNI inline void prefetch_ahead(const uint8_t* codes, const uint16_t* scale) {
  const char* c = reinterpret_cast<const char*>(codes) + 512;
  for (int l = 0; l < 512; l += 64) _mm_prefetch(c + l, _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(scale + 16), _MM_HINT_T0);
}

// Two panels at a time (independent dependency chains), then the rest one by one.
KVR_TARGET_AVX512_VNNI void gemv_avx512(size_t blocks, const int8_t* xq, const float* dx, const int32_t* xoff,
                                        const uint8_t* codes, const uint16_t* scale, size_t np, float* acc) {
  const size_t cs = blocks * 512, ms = blocks * 16;
  size_t q = 0;
  for (; q + 2 <= np; q += 2) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (size_t b = 0; b < blocks; ++b) {
      prefetch_ahead(codes + q * cs + b * 512, scale + q * ms + b * 16);
      prefetch_ahead(codes + (q + 1) * cs + b * 512, scale + (q + 1) * ms + b * 16);
      const __m512 d = _mm512_set1_ps(dx[b]);
      const __m512i i0 = block_dot(xq + b * kB, codes + q * cs + b * 512, xoff[b]);
      const __m512i i1 = block_dot(xq + b * kB, codes + (q + 1) * cs + b * 512, xoff[b]);
      a0 = _mm512_fmadd_ps(_mm512_mul_ps(d, scales16(scale + q * ms + b * 16)), to_f32(i0), a0);
      a1 = _mm512_fmadd_ps(_mm512_mul_ps(d, scales16(scale + (q + 1) * ms + b * 16)), to_f32(i1), a1);
    }
    _mm512_storeu_ps(acc + q * 16, a0);
    _mm512_storeu_ps(acc + q * 16 + 16, a1);
  }
  for (; q < np; ++q) {
    __m512 a0 = _mm512_setzero_ps();
    for (size_t b = 0; b < blocks; ++b) {
      const __m512i i0 = block_dot(xq + b * kB, codes + q * cs + b * 512, xoff[b]);
      a0 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dx[b]), scales16(scale + q * ms + b * 16)), to_f32(i0),
                           a0);
    }
    _mm512_storeu_ps(acc + q * 16, a0);
  }
}

// 8 bf16 scales → f32 (AVX2).
KVR_TARGET_AVX2_Q inline __m256 scales8(const uint16_t* s) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// AVX2 (no VNNI): vpmaddubsw needs an unsigned operand and saturates at int16, and 255·127·2
// does not fit, so the weight codes go back to signed q (code ^ 0x80) and the sign trick of
// llama.cpp keeps each pair sum |q_x|·(±q_w) + … ≤ 2·127·127 < 2^15: maddubs(|q_x|,
// sign(q_w, q_x)), then vpmaddwd with ones widens to int32. The result is Σ q_x·q_w exactly —
// what the VNNI dot started at −128·Σq_x gives — so the bits match the other kernels. One ymm
// holds 8 columns × 4 k (half a panel row group: bytes g·64 + h·32 of the block).
KVR_TARGET_AVX2_Q inline void block_dot_avx2(const int8_t* xb, const uint8_t* wb, __m256i* s0, __m256i* s1) {
  const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(-128);
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  for (int g = 0; g < 8; ++g) {
    int32_t x4;
    std::memcpy(&x4, xb + g * 4, 4);
    const __m256i xs = _mm256_set1_epi32(x4);
    const __m256i ax = _mm256_sign_epi8(xs, xs);
    const __m256i w0 = _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(wb + g * 64)), flip);
    const __m256i w1 =
        _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(wb + g * 64 + 32)), flip);
    a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w0, xs)), ones));
    a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w1, xs)), ones));
  }
  *s0 = a0;
  *s1 = a1;
}

KVR_TARGET_AVX2_Q void gemv_avx2(size_t blocks, const int8_t* xq, const float* dx, const int32_t* /*xoff*/,
                                 const uint8_t* codes, const uint16_t* scale, size_t np, float* acc) {
  const size_t cs = blocks * 512, ms = blocks * 16;
  for (size_t q = 0; q < np; ++q) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (size_t b = 0; b < blocks; ++b) {
      __m256i s0, s1;
      block_dot_avx2(xq + b * kB, codes + q * cs + b * 512, &s0, &s1);
      const __m256 d = _mm256_set1_ps(dx[b]);
      const uint16_t* sc = scale + q * ms + b * 16;
      a0 = _mm256_fmadd_ps(_mm256_mul_ps(d, scales8(sc)), _mm256_cvtepi32_ps(s0), a0);
      a1 = _mm256_fmadd_ps(_mm256_mul_ps(d, scales8(sc + 8)), _mm256_cvtepi32_ps(s1), a1);
    }
    _mm256_storeu_ps(acc + q * 16, a0);
    _mm256_storeu_ps(acc + q * 16 + 8, a1);
  }
}

// AVX-VNNI: the AVX-512 kernel's vpdpbusd (unsigned weights, signed activations, started at
// −128·Σq) on ymm halves of each panel.
KVR_TARGET_AVX_VNNI void gemv_avxvnni(size_t blocks, const int8_t* xq, const float* dx, const int32_t* xoff,
                                      const uint8_t* codes, const uint16_t* scale, size_t np, float* acc) {
  const size_t cs = blocks * 512, ms = blocks * 16;
  for (size_t q = 0; q < np; ++q) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (size_t b = 0; b < blocks; ++b) {
      const int8_t* xb = xq + b * kB;
      const uint8_t* wb = codes + q * cs + b * 512;
      __m256i s0 = _mm256_set1_epi32(xoff[b]), s1 = s0;
      for (int g = 0; g < 8; ++g) {
        int32_t x4;
        std::memcpy(&x4, xb + g * 4, 4);
        const __m256i xs = _mm256_set1_epi32(x4);
        s0 = _mm256_dpbusd_avx_epi32(s0, _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + g * 64)), xs);
        s1 = _mm256_dpbusd_avx_epi32(s1, _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + g * 64 + 32)), xs);
      }
      const __m256 d = _mm256_set1_ps(dx[b]);
      const uint16_t* sc = scale + q * ms + b * 16;
      a0 = _mm256_fmadd_ps(_mm256_mul_ps(d, scales8(sc)), _mm256_cvtepi32_ps(s0), a0);
      a1 = _mm256_fmadd_ps(_mm256_mul_ps(d, scales8(sc + 8)), _mm256_cvtepi32_ps(s1), a1);
    }
    _mm256_storeu_ps(acc + q * 16, a0);
    _mm256_storeu_ps(acc + q * 16 + 8, a1);
  }
}

// Dequantization of 4 k rows (one 64-byte group of 16 columns × 4 k) to f32: byte e of each int32
// lane is column c's code for k = 4g + e; code ^ 0x80 is q as int8, sign-extended by the shift
// pairs; scale · q exactly as the scalar loop (a bf16 times |q| ≤ 127 is exact in f32).
KVR_TARGET_AVX512_VNNI void dequant4_avx512(const uint8_t* grp, const uint16_t* scale, float* dst) {
  const __m512i v = _mm512_xor_si512(_mm512_load_si512(grp), _mm512_set1_epi8(-128));
  const __m512 s = scales16(scale);
  _mm512_storeu_ps(dst, _mm512_mul_ps(s, to_f32(_mm512_maskz_srai_epi32(0xFFFF, _mm512_maskz_slli_epi32(0xFFFF, v, 24), 24))));
  _mm512_storeu_ps(dst + 16, _mm512_mul_ps(s, to_f32(_mm512_maskz_srai_epi32(0xFFFF, _mm512_maskz_slli_epi32(0xFFFF, v, 16), 24))));
  _mm512_storeu_ps(dst + 32, _mm512_mul_ps(s, to_f32(_mm512_maskz_srai_epi32(0xFFFF, _mm512_maskz_slli_epi32(0xFFFF, v, 8), 24))));
  _mm512_storeu_ps(dst + 48, _mm512_mul_ps(s, to_f32(_mm512_maskz_srai_epi32(0xFFFF, v, 24))));
}

KVR_TARGET_AVX2_Q void dequant4_avx2(const uint8_t* grp, const uint16_t* scale, float* dst) {
  for (int h = 0; h < 2; ++h) {
    const __m256i v = _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(grp + h * 32)),
                                       _mm256_set1_epi8(-128));
    const __m256 s = scales8(scale + h * 8);
    float* o = dst + h * 8;
    _mm256_storeu_ps(o, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24), 24))));
    _mm256_storeu_ps(o + 16, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 24))));
    _mm256_storeu_ps(o + 32, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 8), 24))));
    _mm256_storeu_ps(o + 48, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_srai_epi32(v, 24))));
  }
}

// One full activation block (32 floats) of quantize_x with AVX2: the same operations as the
// scalar loop (exact max of |x|, d = amax/127, inv = 1/d, round-to-nearest-even of x·inv,
// clamp) — the same codes, scale and sum. The scalar loop's nearbyint is a libm call per element
// at the baseline ISA; this is a few µs less per decode GEMV.
KVR_TARGET_AVX2_Q void qblock_avx2(const float* x, int8_t* codes, float* scale, int32_t* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + 8 * i);
  const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  const float amax = _mm_cvtss_f32(h);
  const float d = amax / 127.f;
  const float inv = d > 0.f ? 1.f / d : 0.f;
  *scale = d;
  const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
  }
  // int32 → int8 in order: the packs interleave 4-element groups per 128-bit lane; the permute
  // puts the dwords (q0[0..3], q1[0..3], q2.., q3.. | q0[4..7], ...) back to q0, q1, q2, q3.
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  const __m256i ord = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), ord);
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  *sum = _mm_cvtsi128_si32(t);
}
#endif

void dequant4_generic(const uint8_t* grp, const uint16_t* scale, float* dst) {
  for (int e = 0; e < 4; ++e)
    for (int c = 0; c < 16; ++c)
      dst[e * 16 + c] = bf16_f32(scale[c]) * static_cast<float>(static_cast<int>(grp[c * 4 + e]) - 128);
}

using Dequant4Fn = void (*)(const uint8_t* grp, const uint16_t* scale, float* dst);

// One full 32-float activation block of quantize_x (nullptr: the scalar loop only).
using QBlockFn = void (*)(const float* x, int8_t* codes, float* scale, int32_t* sum);

struct Kernel {
  const char* name;
  GemvFn gemv;
  Dequant4Fn dequant4;
  QBlockFn qblock;
};

Kernel choose() {
#if KVR_Q8_AVX512
  if (use_avx512_vnni()) return {"avx512-vnni", &gemv_avx512, &dequant4_avx512, &qblock_avx2};
  if (use_avx_vnni()) return {"avx-vnni", &gemv_avxvnni, &dequant4_avx2, &qblock_avx2};
  if (use_avx2_quant()) return {"avx2", &gemv_avx2, &dequant4_avx2, &qblock_avx2};
#endif
  return {"generic", &gemv_generic, &dequant4_generic, nullptr};
}

const Kernel& kernel() {
  static const auto k = per_cap(&choose);  // one per KernelCap (cpu_features.h)
  return k[cap_index()];
}

}  // namespace

void quantize_x(const float* x, size_t k, size_t blocks, int8_t* codes, float* scales,
                int32_t* sums) {
  const QBlockFn qblock = kernel().qblock;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t k0 = b * kB, k1 = std::min(k, k0 + kB);
    if (qblock != nullptr && k1 - k0 == kB) {
      int32_t sum;
      qblock(x + k0, codes + k0, scales + b, &sum);
      if (sums != nullptr) sums[b] = sum;
      continue;
    }
    float amax = 0.f;
    for (size_t i = k0; i < k1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.f;
    const float inv = d > 0.f ? 1.f / d : 0.f;
    scales[b] = d;
    int32_t sum = 0;
    for (size_t i = 0; i < kB; ++i) {
      int q = 0;
      if (k0 + i < k1) q = static_cast<int>(std::nearbyint(x[k0 + i] * inv));
      q = std::clamp(q, -127, 127);
      codes[k0 + i] = static_cast<int8_t>(q);
      sum += q;
    }
    if (sums != nullptr) sums[b] = sum;
  }
}

void gemv(const PackedWeight& w, const int8_t* xq, const float* dx, const int32_t* xoff, size_t p0,
          size_t p1, float* y, bool accumulate) {
  if (p0 >= p1) return;
  const size_t n = w.rows(), blocks = w.q8_blocks();
  constexpr size_t kChunk = 16;  // panels per kernel call (acc on the stack)
  alignas(64) float acc[kChunk * 16];
  for (size_t p = p0; p < p1; p += kChunk) {
    const size_t np = std::min(kChunk, p1 - p);
    kernel().gemv(blocks, xq, dx, xoff, w.panel_q8(p), w.panel_q8_scale(p), np, acc);
    const size_t c0 = p * kPanelWidth, c1 = std::min(n, (p + np) * kPanelWidth);
    if (accumulate) {
      for (size_t c = c0; c < c1; ++c) y[c] += acc[c - c0];
    } else {
      std::memcpy(y + c0, acc, (c1 - c0) * sizeof(float));
    }
  }
}

void dequant_slice(const PackedWeight& w, size_t p, size_t pc, size_t kc, float* dst) {
  const uint8_t* codes = w.panel_q8(p);
  const uint16_t* scale = w.panel_q8_scale(p);
  size_t t = 0;
  for (; t + 4 <= kc; t += 4) {  // whole groups of 4 k (pc is a multiple of 32)
    const size_t k = pc + t, b = k / kB, g = (k % kB) / 4;
    kernel().dequant4(codes + b * 512 + g * 64, scale + b * 16, dst + t * 16);
  }
  for (; t < kc; ++t) {
    const size_t k = pc + t, b = k / kB, g = (k % kB) / 4, e = k % 4;
    const uint8_t* row = codes + b * 512 + g * 64 + e;
    for (size_t c = 0; c < 16; ++c)
      dst[t * 16 + c] = bf16_f32(scale[b * 16 + c]) * static_cast<float>(static_cast<int>(row[c * 4]) - 128);
  }
}

const char* kernel_name() { return kernel().name; }

}  // namespace kvr::cpu::q8
