// q4 weight kernels (see gemm_q4.h): the per-block fit used by PackedWeight::pack_q4, the portable
// integer GEMV and its AVX-512 VNNI, AVX-VNNI and AVX2 twins (compiled per function with target
// attributes, chosen once from cpu_features.h; all compute the same exact int32 block dots, so
// the same bits), and the slice dequantizer used by the f32 tile GEMM for prefill.
#include "host/gemm_q4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "host/cpu_features.h"
#include "host/dtype.h"
#include "host/gemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVR_Q4_X86 1
#define KVR_TARGET_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))
#define KVR_TARGET_AVX2_Q __attribute__((target("avx2,fma,f16c")))
#define KVR_TARGET_AVX_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#else
#define KVR_Q4_X86 0
#endif

namespace kvr::cpu::q4 {
namespace {

constexpr size_t kB = PackedWeight::kQ8Block;  // 32

// acc (16·np) for np panels whose codes / f16 d / f16 m start at the given pointers (strides
// blocks·256 bytes and blocks·16 halves between panels).
using GemvFn = void (*)(size_t blocks, const int8_t* xs, const float* dx, const float* dxs,
                        const uint8_t* codes, const uint16_t* scale, const uint16_t* mins, size_t np,
                        float* acc);

void gemv_generic(size_t blocks, const int8_t* xs, const float* dx, const float* dxs,
                  const uint8_t* codes, const uint16_t* scale, const uint16_t* mins, size_t np,
                  float* acc) {
  for (size_t q = 0; q < np; ++q) {
    const uint8_t* cq = codes + q * blocks * 256;
    const uint16_t* sq = scale + q * blocks * 16;
    const uint16_t* mq = mins + q * blocks * 16;
    float a[16] = {};
    for (size_t b = 0; b < blocks; ++b) {
      int32_t s[16] = {};
      const int8_t* xb = xs + b * kB;
      const uint8_t* wb = cq + b * 256;
      for (int j = 0; j < 4; ++j)
        for (int c = 0; c < 16; ++c)
          for (int e = 0; e < 4; ++e) {
            const int v = wb[j * 64 + c * 4 + e];
            s[c] += (v & 15) * xb[j * 4 + e] + (v >> 4) * xb[16 + j * 4 + e];
          }
      for (int c = 0; c < 16; ++c) {
        a[c] = std::fma(dx[b] * f16_to_f32(sq[b * 16 + c]), static_cast<float>(s[c]), a[c]);
        a[c] = std::fma(dxs[b], f16_to_f32(mq[b * 16 + c]), a[c]);
      }
    }
    std::memcpy(acc + q * 16, a, sizeof a);
  }
}

#if KVR_Q4_X86
// The 8 signed activation words (4 codes each) of one block.
inline void load_x(const int8_t* xb, int32_t* x8) { std::memcpy(x8, xb, 32); }

// int32 → f32 (exact here: |dot| < 2^24); maskz form as in gemm_q8.cpp (GCC 12 -Werror).
KVR_TARGET_AVX512_VNNI inline __m512 to_f32(__m512i v) { return _mm512_maskz_cvtepi32_ps(0xFFFF, v); }

// One panel's block dot: 4 loads of 64 bytes, low / high nibbles as vpdpbusd's unsigned operand,
// the signed activation words broadcast.
KVR_TARGET_AVX512_VNNI inline __m512i block_dot512(const uint8_t* wb, const int32_t* x8) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
  for (int j = 0; j < 4; ++j) {
    const __m512i v = _mm512_load_si512(wb + j * 64);
    s0 = _mm512_dpbusd_epi32(s0, _mm512_and_si512(v, m4), _mm512_set1_epi32(x8[j]));
    s1 = _mm512_dpbusd_epi32(s1, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4), _mm512_set1_epi32(x8[j + 4]));
  }
  return _mm512_add_epi32(s0, s1);
}

KVR_TARGET_AVX512_VNNI inline __m512 block_fma512(__m512 a, __m512i dot, float dx, float dxs,
                                                  const uint16_t* sc, const uint16_t* mn) {
  const __m512 d = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc)));
  const __m512 m = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mn)));
  a = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dx), d), to_f32(dot), a);
  return _mm512_fmadd_ps(_mm512_set1_ps(dxs), m, a);
}

// Two panels at a time (independent chains), then the rest.
KVR_TARGET_AVX512_VNNI void gemv_avx512(size_t blocks, const int8_t* xs, const float* dx,
                                        const float* dxs, const uint8_t* codes, const uint16_t* scale,
                                        const uint16_t* mins, size_t np, float* acc) {
  const size_t cs = blocks * 256, ms = blocks * 16;
  size_t q = 0;
  for (; q + 2 <= np; q += 2) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (size_t b = 0; b < blocks; ++b) {
      int32_t x8[8];
      load_x(xs + b * kB, x8);
      const __m512i i0 = block_dot512(codes + q * cs + b * 256, x8);
      const __m512i i1 = block_dot512(codes + (q + 1) * cs + b * 256, x8);
      a0 = block_fma512(a0, i0, dx[b], dxs[b], scale + q * ms + b * 16, mins + q * ms + b * 16);
      a1 = block_fma512(a1, i1, dx[b], dxs[b], scale + (q + 1) * ms + b * 16, mins + (q + 1) * ms + b * 16);
    }
    _mm512_storeu_ps(acc + q * 16, a0);
    _mm512_storeu_ps(acc + q * 16 + 16, a1);
  }
  for (; q < np; ++q) {
    __m512 a0 = _mm512_setzero_ps();
    for (size_t b = 0; b < blocks; ++b) {
      int32_t x8[8];
      load_x(xs + b * kB, x8);
      a0 = block_fma512(a0, block_dot512(codes + q * cs + b * 256, x8), dx[b], dxs[b], scale + q * ms + b * 16,
                        mins + q * ms + b * 16);
    }
    _mm512_storeu_ps(acc + q * 16, a0);
  }
}

// ymm epilogue for the 8 columns of half h of a panel block.
KVR_TARGET_AVX2_Q inline __m256 block_fma256(__m256 a, __m256i dot, float dx, float dxs,
                                             const uint16_t* sc, const uint16_t* mn) {
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
  const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn)));
  a = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dx), d), _mm256_cvtepi32_ps(dot), a);
  return _mm256_fmadd_ps(_mm256_set1_ps(dxs), m, a);
}

// AVX2: vpmaddubsw(nibbles, signed codes) gives pair sums ≤ 2·15·127; the 8 of one block add up
// to ≤ 30480 < 2^15 in int16 (exact), then one vpmaddwd with ones widens to int32.
KVR_TARGET_AVX2_Q inline __m256i block_dot_avx2(const uint8_t* wb, const int32_t* x8) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256i p = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + j * 64));
    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(_mm256_and_si256(v, m4), _mm256_set1_epi32(x8[j])));
    p = _mm256_add_epi16(
        p, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_set1_epi32(x8[j + 4])));
  }
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

KVR_TARGET_AVX2_Q void gemv_avx2(size_t blocks, const int8_t* xs, const float* dx, const float* dxs,
                                 const uint8_t* codes, const uint16_t* scale, const uint16_t* mins,
                                 size_t np, float* acc) {
  const size_t cs = blocks * 256, ms = blocks * 16;
  for (size_t q = 0; q < np; ++q) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (size_t b = 0; b < blocks; ++b) {
      int32_t x8[8];
      load_x(xs + b * kB, x8);
      const uint8_t* wb = codes + q * cs + b * 256;
      const uint16_t *sc = scale + q * ms + b * 16, *mn = mins + q * ms + b * 16;
      a0 = block_fma256(a0, block_dot_avx2(wb, x8), dx[b], dxs[b], sc, mn);
      a1 = block_fma256(a1, block_dot_avx2(wb + 32, x8), dx[b], dxs[b], sc + 8, mn + 8);
    }
    _mm256_storeu_ps(acc + q * 16, a0);
    _mm256_storeu_ps(acc + q * 16 + 8, a1);
  }
}

// AVX-VNNI: the AVX-512 kernel's vpdpbusd on ymm halves of each panel.
KVR_TARGET_AVX_VNNI inline __m256i block_dot_vnni256(const uint8_t* wb, const int32_t* x8) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + j * 64));
    s0 = _mm256_dpbusd_avx_epi32(s0, _mm256_and_si256(v, m4), _mm256_set1_epi32(x8[j]));
    s1 = _mm256_dpbusd_avx_epi32(s1, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_set1_epi32(x8[j + 4]));
  }
  return _mm256_add_epi32(s0, s1);
}

KVR_TARGET_AVX_VNNI void gemv_avxvnni(size_t blocks, const int8_t* xs, const float* dx, const float* dxs,
                                      const uint8_t* codes, const uint16_t* scale, const uint16_t* mins,
                                      size_t np, float* acc) {
  const size_t cs = blocks * 256, ms = blocks * 16;
  for (size_t q = 0; q < np; ++q) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (size_t b = 0; b < blocks; ++b) {
      int32_t x8[8];
      load_x(xs + b * kB, x8);
      const uint8_t* wb = codes + q * cs + b * 256;
      const uint16_t *sc = scale + q * ms + b * 16, *mn = mins + q * ms + b * 16;
      a0 = block_fma256(a0, block_dot_vnni256(wb, x8), dx[b], dxs[b], sc, mn);
      a1 = block_fma256(a1, block_dot_vnni256(wb + 32, x8), dx[b], dxs[b], sc + 8, mn + 8);
    }
    _mm256_storeu_ps(acc + q * 16, a0);
    _mm256_storeu_ps(acc + q * 16 + 8, a1);
  }
}

// Dequantization of 4 k rows of 16 columns from one 64-byte code group (nibbles at bit 8e + shift
// of each int32 lane; shift 0 or 4 picks k < 16 or k ≥ 16 of the block) to d·c + m in f32, as the
// scalar loop (a product, then a sum: no fma).
KVR_TARGET_AVX512_VNNI void dequant4_avx512(const uint8_t* grp, int shift, const uint16_t* sc,
                                            const uint16_t* mn, float* dst) {
  const __m512i v = _mm512_maskz_srl_epi32(0xFFFF, _mm512_load_si512(grp), _mm_cvtsi32_si128(shift));
  const __m512i m4 = _mm512_set1_epi32(0x0F);
  const __m512 d = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc)));
  const __m512 m = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mn)));
  for (int e = 0; e < 4; ++e) {
    const __m512i c = _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, v, static_cast<unsigned>(8 * e)), m4);
    _mm512_storeu_ps(dst + e * 16, _mm512_add_ps(_mm512_mul_ps(d, to_f32(c)), m));
  }
}

KVR_TARGET_AVX2_Q void dequant4_avx2(const uint8_t* grp, int shift, const uint16_t* sc,
                                     const uint16_t* mn, float* dst) {
  const __m256i m4 = _mm256_set1_epi32(0x0F);
  for (int h = 0; h < 2; ++h) {
    const __m256i v = _mm256_srl_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(grp + h * 32)),
                                       _mm_cvtsi32_si128(shift));
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + h * 8)));
    const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + h * 8)));
    for (int e = 0; e < 4; ++e) {
      const __m256i c = _mm256_and_si256(_mm256_srli_epi32(v, 8 * e), m4);
      _mm256_storeu_ps(dst + e * 16 + h * 8, _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(c)), m));
    }
  }
}
#endif

void dequant4_generic(const uint8_t* grp, int shift, const uint16_t* sc, const uint16_t* mn, float* dst) {
  for (int e = 0; e < 4; ++e)
    for (int c = 0; c < 16; ++c) {
      const int code = (grp[c * 4 + e] >> shift) & 15;
      dst[e * 16 + c] = f16_to_f32(sc[c]) * static_cast<float>(code) + f16_to_f32(mn[c]);
    }
}

using Dequant4Fn = void (*)(const uint8_t* grp, int shift, const uint16_t* sc, const uint16_t* mn,
                            float* dst);

struct Kernel {
  const char* name;
  GemvFn gemv;
  Dequant4Fn dequant4;
};

Kernel choose() {
#if KVR_Q4_X86
  if (use_avx512_vnni()) return {"avx512-vnni", &gemv_avx512, &dequant4_avx512};
  if (use_avx_vnni()) return {"avx-vnni", &gemv_avxvnni, &dequant4_avx2};
  if (use_avx2_quant()) return {"avx2", &gemv_avx2, &dequant4_avx2};
#endif
  return {"generic", &gemv_generic, &dequant4_generic};
}

const Kernel& kernel() {
  static const auto k = per_cap(&choose);  // one per KernelCap (cpu_features.h)
  return k[cap_index()];
}

// Squared error of v ≈ d·c + m with d, m rounded to f16 and the nearest codes in [0, 15];
// codes into c, the f16 bits into *dh, *mh. Infinite when d or m is not a finite f16.
double eval_fit(const float* v, size_t n, float d, float m, uint8_t* c, uint16_t* dh, uint16_t* mh) {
  *dh = f32_to_f16(d);
  *mh = f32_to_f16(m);
  const float df = f16_to_f32(*dh), mf = f16_to_f32(*mh);
  if (!std::isfinite(df) || !std::isfinite(mf) || df < 0.f) return INFINITY;
  const float inv = df > 0.f ? 1.f / df : 0.f;
  double err = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const float t = std::nearbyint((v[i] - mf) * inv);
    const int q = t != t ? 0 : static_cast<int>(std::clamp(t, 0.f, 15.f));
    c[i] = static_cast<uint8_t>(q);
    const double r = static_cast<double>(v[i]) - static_cast<double>(df * static_cast<float>(q) + mf);
    err += r * r;
  }
  return err;
}

}  // namespace

void fit_block(const float* v, size_t n, uint8_t* codes, uint16_t* d16, uint16_t* m16) {
  float mn = v[0], mx = v[0];
  for (size_t i = 1; i < n; ++i) {
    mn = std::min(mn, v[i]);
    mx = std::max(mx, v[i]);
  }
  uint8_t cur[32], tmp[32];
  uint16_t dh, mh, tdh, tmh;
  double best = eval_fit(v, n, (mx - mn) / 15.f, mn, cur, &dh, &mh);
  // Least-squares refits: given the codes, the d and m minimising Σ (v − d·c − m)²; keep while
  // the (f16-rounded) error drops. Min/max wastes range on outliers; this trades a clipped
  // outlier for finer steps elsewhere when that is better in total.
  for (int it = 0; it < 4; ++it) {
    double sc = 0, scc = 0, sv = 0, svc = 0;
    for (size_t i = 0; i < n; ++i) {
      const double c = cur[i], x = v[i];
      sc += c;
      scc += c * c;
      sv += x;
      svc += x * c;
    }
    const double det = static_cast<double>(n) * scc - sc * sc;
    if (det <= 0.0) break;
    const double d = (static_cast<double>(n) * svc - sc * sv) / det;
    const double m = (sv - d * sc) / static_cast<double>(n);
    const double err = eval_fit(v, n, static_cast<float>(d), static_cast<float>(m), tmp, &tdh, &tmh);
    if (!(err < best)) break;
    best = err;
    dh = tdh;
    mh = tmh;
    std::memcpy(cur, tmp, n);
  }
  if (!(best < INFINITY)) {  // non-finite weights or out of f16 range: zero block
    dh = 0;
    mh = 0;
    std::memset(cur, 0, n);
  }
  std::memcpy(codes, cur, n);
  *d16 = dh;
  *m16 = mh;
}

void gemv(const PackedWeight& w, const int8_t* xs, const float* dx, const float* dxs, size_t p0,
          size_t p1, float* y, bool accumulate) {
  if (p0 >= p1) return;
  const size_t n = w.rows(), blocks = w.q8_blocks();
  constexpr size_t kChunk = 16;  // panels per kernel call (acc on the stack)
  alignas(64) float acc[kChunk * 16];
  for (size_t p = p0; p < p1; p += kChunk) {
    const size_t np = std::min(kChunk, p1 - p);
    kernel().gemv(blocks, xs, dx, dxs, w.panel_q4(p), w.panel_q4_scale(p), w.panel_q4_min(p), np, acc);
    const size_t c0 = p * kPanelWidth, c1 = std::min(n, (p + np) * kPanelWidth);
    if (accumulate) {
      for (size_t c = c0; c < c1; ++c) y[c] += acc[c - c0];
    } else {
      std::memcpy(y + c0, acc, (c1 - c0) * sizeof(float));
    }
  }
}

void dequant_slice(const PackedWeight& w, size_t p, size_t pc, size_t kc, float* dst) {
  const uint8_t* codes = w.panel_q4(p);
  const uint16_t* scale = w.panel_q4_scale(p);
  const uint16_t* mins = w.panel_q4_min(p);
  size_t t = 0;
  for (; t + 4 <= kc; t += 4) {  // whole groups of 4 k (pc is a multiple of 32)
    const size_t k = pc + t, b = k / kB, r = k % kB;
    kernel().dequant4(codes + b * 256 + ((r % 16) / 4) * 64, r < 16 ? 0 : 4, scale + b * 16,
                      mins + b * 16, dst + t * 16);
  }
  size_t cur_b = SIZE_MAX;
  float d[16], m[16];
  for (; t < kc; ++t) {
    const size_t k = pc + t, b = k / kB, r = k % kB;
    if (b != cur_b) {
      cur_b = b;
      for (size_t c = 0; c < 16; ++c) {
        d[c] = f16_to_f32(scale[b * 16 + c]);
        m[c] = f16_to_f32(mins[b * 16 + c]);
      }
    }
    const size_t j = (r % 16) / 4, e = r % 4, shift = r < 16 ? 0 : 4;
    const uint8_t* row = codes + b * 256 + j * 64 + e;
    for (size_t c = 0; c < 16; ++c) {
      const int code = (row[c * 4] >> shift) & 15;
      dst[t * 16 + c] = d[c] * static_cast<float>(code) + m[c];
    }
  }
}

const char* kernel_name() { return kernel().name; }

}  // namespace kvr::cpu::q4
