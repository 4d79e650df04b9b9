// Math that the CPU and CUDA backends must compute bit for bit alike, as __host__ __device__
// inline functions: f32 <-> bf16/f16 rounding (nearest-even, NaN kept quiet), RoPE cos/sin of an
// angle (a fixed double-precision sincos, not the platform's), the online-softmax merge of two
// partial states, and the launch/tiling plans of the CUDA kernels. Compiles with g++ and nvcc;
// unit-tested by g++ (device_math_test.cpp). Not a general math library.
//
// Bit-exactness: every floating-point step that must match is written with the *_rn helpers
// below, which are never contracted into FMAs (nvcc contracts a*b+c by default; g++ for
// baseline x86-64 has no FMA instruction, and the host versions are kept out of line where
// they could be inlined into AVX2/FMA code).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVR_HD __host__ __device__ __forceinline__
#define KVR_HD_NOINLINE __host__ __device__ __forceinline__  // .cu files hold no AVX2/FMA code
#else
#define KVR_HD inline
#define KVR_HD_NOINLINE inline __attribute__((noinline))
#endif

namespace kvr::dm {

// ---- uncontracted IEEE arithmetic (round to nearest even) ----
#if defined(__CUDA_ARCH__)
KVR_HD double dadd(double a, double b) { return __dadd_rn(a, b); }
KVR_HD double dsub(double a, double b) { return __dsub_rn(a, b); }
KVR_HD double dmul(double a, double b) { return __dmul_rn(a, b); }
KVR_HD float fadd(float a, float b) { return __fadd_rn(a, b); }
KVR_HD float fsub(float a, float b) { return __fsub_rn(a, b); }
KVR_HD float fmul(float a, float b) { return __fmul_rn(a, b); }
KVR_HD uint32_t f32_bits(float f) { return __float_as_uint(f); }
KVR_HD float bits_f32(uint32_t u) { return __uint_as_float(u); }
KVR_HD uint64_t f64_bits(double f) { return static_cast<uint64_t>(__double_as_longlong(f)); }
KVR_HD double bits_f64(uint64_t u) { return __longlong_as_double(static_cast<long long>(u)); }
#else
KVR_HD double dadd(double a, double b) { return a + b; }
KVR_HD double dsub(double a, double b) { return a - b; }
KVR_HD double dmul(double a, double b) { return a * b; }
KVR_HD float fadd(float a, float b) { return a + b; }
KVR_HD float fsub(float a, float b) { return a - b; }
KVR_HD float fmul(float a, float b) { return a * b; }
KVR_HD uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
KVR_HD float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
KVR_HD uint64_t f64_bits(double f) {
  uint64_t u;
  std::memcpy(&u, &f, 8);
  return u;
}
KVR_HD double bits_f64(uint64_t u) {
  double f;
  std::memcpy(&f, &u, 8);
  return f;
}
#endif

// ---- dtype rounding ----
KVR_HD float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// Round-to-nearest-even; a NaN stays a quiet NaN with its top payload bits.
KVR_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

KVR_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = fmul(static_cast<float>(m), 5.9604644775390625e-8f);  // m * 2^-24, exact
    return bits_f32(f32_bits(v) | sign);
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));  // NaN quiet, as F16C
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// Same results as F16C vcvtps2ph with round-to-nearest-even (F. Giesen's float_to_half_rtne).
KVR_HD uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN (NaN: quiet, top payload bits kept)
    return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? (0x200u | ((ax >> 13) & 0x3ffu)) : 0u));
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (ax < 0x38800000u) {  // result is subnormal or zero: let the FPU round at 2^-24
    const float r = fadd(bits_f32(ax), 0.5f);
    return static_cast<uint16_t>(sign | (f32_bits(r) - 0x3f000000u));
  }
  const uint32_t odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + odd;  // rebias exponent (15 - 127) << 23, plus rounding bias
  return static_cast<uint16_t>(sign | (ax >> 13));
}

// ---- RoPE angles ----
// cos and sin of `ang` radians in double, then rounded to f32. fdlibm's medium-range reduction
// (x - k·π/2 with π/2 split in a 33-bit head and a tail: exact k·head for |k| < 2^20, i.e. angles
// below ~1.6e6 rad; larger angles lose accuracy gradually) and its sin/cos kernels on
// [-π/4, π/4]. Within ~1 ulp (double) of the true values, so the f32 results equal the correctly
// rounded ones except in rare near-ties; what matters is that both backends get the same bits.
KVR_HD_NOINLINE void sincos_f32(double ang, float* c_out, float* s_out) {
  const double kInvPio2 = 6.36619772367581382433e-01;
  const double kPio2_1 = 1.57079632673412561417e+00;   // first 33 bits of π/2
  const double kPio2_1t = 6.07710050650619224932e-11;  // π/2 - kPio2_1
  const bool neg = ang < 0.0;
  const double x = neg ? -ang : ang;
  // k = nearest integer to x·2/π (x < 2^52 here, so the 2^52 trick rounds exactly).
  double k = dsub(dadd(dmul(x, kInvPio2), 6755399441055744.0), 6755399441055744.0);
  const double r = dsub(x, dmul(k, kPio2_1));
  const double y = dsub(r, dmul(k, kPio2_1t));
  const double z = dmul(y, y);
  // __kernel_sin / __kernel_cos (fdlibm), without the tail correction.
  const double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03,
               S3 = -1.98412698298579493134e-04, S4 = 2.75573137070700676789e-06,
               S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;
  const double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03,
               C3 = 2.48015872894767294178e-05, C4 = -2.75573143513906633035e-07,
               C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;
  const double sp = dadd(S2, dmul(z, dadd(S3, dmul(z, dadd(S4, dmul(z, dadd(S5, dmul(z, S6))))))));
  const double sn = dadd(y, dmul(dmul(z, y), dadd(S1, dmul(z, sp))));
  const double cp = dmul(z, dadd(C1, dmul(z, dadd(C2, dmul(z, dadd(C3, dmul(z, dadd(C4, dmul(z, dadd(C5, dmul(z, C6)))))))))));
  const double hz = dmul(0.5, z);
  const double w = dsub(1.0, hz);
  const double cs = dadd(w, dadd(dsub(dsub(1.0, w), hz), dmul(z, cp)));
  double sv, cv;
  switch (static_cast<int64_t>(k) & 3) {
    case 0: sv = sn; cv = cs; break;
    case 1: sv = cs; cv = -sn; break;
    case 2: sv = -sn; cv = -cs; break;
    default: sv = -cs; cv = sn; break;
  }
  if (neg) sv = -sv;
  *c_out = static_cast<float>(cv);
  *s_out = static_cast<float>(sv);
}

// RoPE cos/sin for one (position, frequency pair): angle = pos · inv_freq in double (the
// inverse frequencies come from the model's params, computed once on the host).
KVR_HD void rope_cos_sin(uint32_t pos, double inv_freq, float* c, float* s) {
  sincos_f32(dmul(static_cast<double>(pos), inv_freq), c, s);
}

// Rotate-half applied to one pair (x[i], x[i+half]) in f32, uncontracted: the CPU's cpu::rope.
KVR_HD void rope_pair(float a, float b, float c, float s, float* out_a, float* out_b) {
  *out_a = fsub(fmul(a, c), fmul(b, s));
  *out_b = fadd(fmul(b, c), fmul(a, s));
}

// ---- exp and the online-softmax merge ----
// exp(x) in f32 from a fixed polynomial (Cephes expf, ~1 ulp on [-87.3, 88.3], inputs clamped;
// -inf gives 0): identical on host and device, so merges of the same partials agree bitwise.
KVR_HD float exp_f32(float x) {
  if (x != x) return x;
  if (x <= -87.3f) return 0.0f;
  if (x > 88.3f) x = 88.3f;
  // fl = floor(x·log2(e) + 0.5): x > -87.3 keeps it in [-126, 127], so the scale 2^fl below
  // is a normal float.
  const float fx = fadd(fmul(x, 1.44269504088896341f), 0.5f);
  const int32_t ti = static_cast<int32_t>(fx);  // truncates toward zero
  const float fl = static_cast<float>(fx < static_cast<float>(ti) ? ti - 1 : ti);
  x = fsub(x, fmul(fl, 0.693359375f));
  x = fsub(x, fmul(fl, -2.12194440e-4f));
  float y = 1.9875691500e-4f;
  y = fadd(fmul(y, x), 1.3981999507e-3f);
  y = fadd(fmul(y, x), 8.3334519073e-3f);
  y = fadd(fmul(y, x), 4.1665795894e-2f);
  y = fadd(fmul(y, x), 1.6666665459e-1f);
  y = fadd(fmul(y, x), 5.0000001201e-1f);
  y = fadd(fmul(y, fmul(x, x)), fadd(x, 1.0f));
  const int32_t e = static_cast<int32_t>(fl) + 127;
  return fmul(y, bits_f32(static_cast<uint32_t>(e) << 23));
}

// One partial softmax over a key range for one query row: running max m (-inf when no key was
// seen), sum l = Σ exp(s - m), and an accumulator Σ exp(s - m)·v kept by the caller.
struct SoftmaxPart {
  float m;
  float l;
};

// Merge weights of two partials: the merged max, and the factors wa, wb by which each part's
// sum and accumulator are scaled (merged l = wa·la + wb·lb). An empty part (m = -inf) gets 0.
KVR_HD void softmax_merge(SoftmaxPart a, SoftmaxPart b, float* m, float* wa, float* wb) {
  const float mm = a.m > b.m ? a.m : b.m;
  *m = mm;
  const bool a_empty = !(a.m > -3.0e38f), b_empty = !(b.m > -3.0e38f);
  *wa = a_empty ? 0.0f : exp_f32(fsub(a.m, mm));
  *wb = b_empty ? 0.0f : exp_f32(fsub(b.m, mm));
}

// ---- launch and tiling plans of the CUDA kernels (pure integer arithmetic) ----
KVR_HD uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// Flash attention (prefill and decode share one kernel): a block of kAttnWarps warps works on
// one kv head and `rows_per_block` rows of the flattened (token, head-in-GQA-group) list, over
// the keys of one split; key tiles of kAttnKeyTile keys (one per lane).
constexpr uint32_t kAttnWarps = 4;
constexpr uint32_t kAttnKeyTile = 32;
constexpr uint32_t kAttnMaxSplits = 64;
constexpr uint32_t kAttnKeyPad = 4;  // floats of padding per K row in shared memory (float4 reads)

struct AttnPlan {
  uint32_t rows_per_warp;  // 1 (decode-like) or 4 (prefill)
  uint32_t rows;           // n_tokens · group
  uint32_t row_blocks;     // grid.x
  uint32_t kv_heads;       // grid.y
  uint32_t splits;         // grid.z; 1 = no merge step
  uint32_t head_dim;
  size_t smem_bytes;       // dynamic shared memory per block
  size_t partial_floats;   // workspace for splits > 1: splits · rows · kv_heads · (head_dim + 2)
};

// Shared memory of one attention block: K tile (keys, head_dim + kAttnKeyPad) and V tile
// (keys, head_dim) in f32, plus the warps' query rows.
KVR_HD size_t attn_smem_bytes(uint32_t head_dim, uint32_t rows_per_warp) {
  return sizeof(float) * (static_cast<size_t>(kAttnKeyTile) * (head_dim + kAttnKeyPad) +
                          static_cast<size_t>(kAttnKeyTile) * head_dim +
                          static_cast<size_t>(kAttnWarps) * rows_per_warp * head_dim);
}

// n_tokens new queries per kv head (GQA group `group`), keys [0, ctx_end). `fixed_splits` > 0
// forces the split count (a CUDA graph replays one grid for every context length; splits
// beyond the context are then empty); 0 chooses from the context so that about 2 blocks per
// SM are busy.
KVR_HD AttnPlan plan_attention(uint32_t n_tokens, uint32_t group, uint32_t kv_heads, uint32_t head_dim,
                               uint32_t ctx_end, uint32_t sm_count, uint32_t fixed_splits) {
  AttnPlan p{};
  p.rows = n_tokens * group;
  p.rows_per_warp = p.rows >= 8 * kAttnWarps ? 4u : 1u;
  p.row_blocks = ceil_div(p.rows, p.rows_per_warp * kAttnWarps);
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  if (fixed_splits > 0) {
    p.splits = fixed_splits < kAttnMaxSplits ? fixed_splits : kAttnMaxSplits;
  } else {
    const uint32_t blocks = p.row_blocks * kv_heads;
    const uint32_t want = blocks >= 2 * sm_count ? 1u : ceil_div(2 * sm_count, blocks);
    const uint32_t tiles = ceil_div(ctx_end > 0 ? ctx_end : 1u, kAttnKeyTile);
    uint32_t s = want < tiles ? want : tiles;
    if (s > kAttnMaxSplits) s = kAttnMaxSplits;
    // Drop splits that would be empty after rounding each split to whole tiles.
    const uint32_t per = ceil_div(tiles, s > 0 ? s : 1u);
    p.splits = ceil_div(tiles, per);
  }
  p.smem_bytes = attn_smem_bytes(head_dim, p.rows_per_warp);
  p.partial_floats = p.splits > 1 ? static_cast<size_t>(p.splits) * p.rows * kv_heads * (head_dim + 2) : 0;
  return p;
}

// Upper bound of plan_attention(...).partial_floats over every context and token count when the
// split count is chosen by the plan (fixed_splits = 0): splits > 1 only while row_blocks ·
// kv_heads < 2·SMs, and then splits · row_blocks · kv_heads < 4·SMs.
KVR_HD size_t attn_partial_bound(uint32_t sm_count, uint32_t head_dim) {
  return static_cast<size_t>(4) * sm_count * (4 * kAttnWarps) * (head_dim + 2);
}

// Key range [begin, end) of split `s` of `splits` over keys [0, ctx_end): whole tiles, the same
// number per split (the last may be shorter or empty). Also evaluated inside the kernel, where
// ctx_end comes from device memory.
KVR_HD void attn_split_range(uint32_t ctx_end, uint32_t splits, uint32_t s, uint32_t* begin, uint32_t* end) {
  const uint32_t tiles = ceil_div(ctx_end, kAttnKeyTile);
  const uint32_t per = ceil_div(tiles, splits);
  const uint32_t b = s * per * kAttnKeyTile, e = (s + 1) * per * kAttnKeyTile;
  *begin = b < ctx_end ? b : ctx_end;
  *end = e < ctx_end ? e : ctx_end;
}

// GEMV (decode projections, y = W·x): kGemvWarps warps per block, each warp kGemvRowsPerWarp
// consecutive output rows; a lane reads 16 bytes of a weight row per step.
constexpr uint32_t kGemvWarps = 8;
constexpr uint32_t kGemvRowsPerWarp = 2;

struct GemvPlan {
  uint32_t blocks;
  uint32_t threads;
  bool vector;  // 16-byte loads: K a multiple of the elements per 16 bytes (8 bf16, 4 f32)
};

KVR_HD GemvPlan plan_gemv(uint32_t n_rows, uint32_t k, uint32_t weight_elem_bytes) {
  GemvPlan p{};
  p.threads = kGemvWarps * 32;
  p.blocks = ceil_div(n_rows, kGemvWarps * kGemvRowsPerWarp);
  p.vector = k % (16 / weight_elem_bytes) == 0;
  return p;
}

// Tensor-core GEMM fallback (C = A·Wᵀ, mma.sync m16n8k16 bf16): block tile kGemmBM × kGemmBN,
// k step kGemmBK, 4 warps as 2×2, each warp 32×32.
constexpr uint32_t kGemmBM = 64, kGemmBN = 64, kGemmBK = 32;

struct GemmPlan {
  uint32_t grid_m, grid_n;
  uint32_t k_steps;
};

KVR_HD GemmPlan plan_gemm(uint32_t m, uint32_t n, uint32_t k) {
  GemmPlan p{};
  p.grid_m = ceil_div(m, kGemmBM);
  p.grid_n = ceil_div(n, kGemmBN);
  p.k_steps = ceil_div(k, kGemmBK);
  return p;
}

// Split of an f32 value into two bf16 terms hi + lo (hi = round(x), lo = round(x - hi)): the
// product with an exact bf16 weight then carries ~16 mantissa bits of x instead of 8. Used by
// the prefill GEMMs so tensor-core results stay within f32-level error of the CPU's.
KVR_HD void split_bf16(float x, uint16_t* hi, uint16_t* lo) {
  *hi = f32_to_bf16(x);
  *lo = f32_to_bf16(fsub(x, bf16_to_f32(*hi)));
}

}  // namespace kvr::dm
