// g++ unit tests of common/device_math.h (the math the CPU and CUDA backends share), against
// independent references: exhaustive bf16/f16 round trips, RNE rounding from long double, the
// C library's cos/sin/exp, a one-pass softmax, and coverage properties of the launch plans.
// Built by CMake as kvr_device_math_test; run by device_math_test.ts. Exit status 1 on failure.
#include "common/device_math.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

namespace {

using namespace kvr::dm;

int g_checks = 0, g_failures = 0;

void check(bool ok, const char* what, double a = 0, double b = 0) {
  ++g_checks;
  if (!ok) {
    if (++g_failures <= 20) std::printf("FAIL %s (%.17g vs %.17g)\n", what, a, b);
  }
}

// Reference RNE of an f32 to a format with `mbits` mantissa bits, via exact long double
// arithmetic on the two neighbours (normal results only).
float round_ref_normal(float x, int mbits) {
  if (x == 0.0f || !std::isfinite(x)) return x;
  int e;
  const long double f = std::frexp(static_cast<long double>(x), &e);  // x = f·2^e, |f| in [0.5, 1)
  const long double scaled = std::ldexp(f, mbits + 1);                 // integer part holds mbits+1 bits
  long double lo = std::floor(scaled), hi = lo + 1;
  const long double dl = scaled - lo, dh = hi - scaled;
  long double r;
  if (dl < dh) r = lo;
  else if (dh < dl) r = hi;
  else r = std::fmod(lo, 2.0L) == 0 ? lo : hi;
  return static_cast<float>(std::ldexp(r, e - mbits - 1));
}

void test_bf16() {
  // Every bf16 widens exactly and rounds back to itself (NaNs stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    const uint16_t back = f32_to_bf16(f);
    if (std::isnan(f)) check(std::isnan(bf16_to_f32(back)) && (back & 0x40u), "bf16 NaN stays quiet NaN");
    else check(back == h, "bf16 round trip", h, back);
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> bits;
  int bad = 0;
  for (int i = 0; i < 2000000; ++i) {
    const float x = bits_f32(bits(rng));
    if (!std::isfinite(x) || std::fabs(x) < 1e-37f || std::fabs(x) > 3e38f) continue;
    const float got = bf16_to_f32(f32_to_bf16(x)), want = round_ref_normal(x, 7);
    if (f32_bits(got) != f32_bits(want)) ++bad;
  }
  check(bad == 0, "bf16 RNE equals the long-double reference on 2M random floats", bad, 0);
  check(f32_to_bf16(bits_f32(0x3f808000u)) == 0x3f80u, "bf16 tie rounds to even (down)");
  check(f32_to_bf16(bits_f32(0x3f818000u)) == 0x3f82u, "bf16 tie rounds to even (up)");
  check(f32_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80u, "bf16 +inf");
}

void test_f16() {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    const uint16_t back = f32_to_f16(f);
    if (std::isnan(f)) check((back & 0x7c00u) == 0x7c00u && (back & 0x3ffu) && (back & 0x200u), "f16 NaN quiet");
    else check(back == h, "f16 round trip", h, back);
  }
  // Against the compiler's _Float16 conversion (IEEE RNE, subnormals included).
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> mag(-20.f, 17.f);
  int bad = 0;
  for (int i = 0; i < 2000000; ++i) {
    const float x = (i & 1 ? -1.f : 1.f) * std::exp2(mag(rng));
    const _Float16 r = static_cast<_Float16>(x);
    uint16_t want;
    std::memcpy(&want, &r, 2);
    if (f32_to_f16(x) != want) ++bad;
  }
  check(bad == 0, "f16 RNE equals _Float16 conversion on 2M floats (normal, subnormal, overflow)", bad, 0);
}

void test_rope() {
  // Against glibc's double cos/sin rounded to f32: same bits except at rare near-ties, and never
  // more than one f32 ulp apart.
  const double freqs[] = {1.0, 0.5, 0.1, 1.0 / 10000.0, 0.0178, 3.3e-6, 0.9999};
  int mism = 0, total = 0;
  float worst = 0;
  for (double f : freqs) {
    for (uint32_t pos = 0; pos < 200000; pos += (pos < 4096 ? 1 : 7)) {
      float c, s;
      rope_cos_sin(pos, f, &c, &s);
      const double ang = static_cast<double>(pos) * f;
      const float rc = static_cast<float>(std::cos(ang)), rs = static_cast<float>(std::sin(ang));
      total += 2;
      if (c != rc) ++mism;
      if (s != rs) ++mism;
      const float ulp_c = std::nextafter(std::fabs(rc), 2.f) - std::fabs(rc);
      const float ulp_s = std::nextafter(std::fabs(rs), 2.f) - std::fabs(rs);
      worst = std::fmax(worst, std::fabs(c - rc) / ulp_c);
      worst = std::fmax(worst, std::fabs(s - rs) / ulp_s);
    }
  }
  std::printf("rope: %d of %d f32 cos/sin differ from glibc's (worst %.2f ulp)\n", mism, total, worst);
  check(mism * 10000 <= total, "rope cos/sin match glibc's correctly rounded values (< 1e-4 differ)", mism, total);
  check(worst <= 1.0f, "rope cos/sin within 1 f32 ulp", worst, 1);
  float c, s;
  sincos_f32(-1.25, &c, &s);
  check(s == static_cast<float>(std::sin(-1.25)) && c == static_cast<float>(std::cos(-1.25)), "sincos of a negative angle");
  float a, b;
  rope_pair(1.5f, -2.0f, 0.6f, 0.8f, &a, &b);
  check(a == 1.5f * 0.6f - (-2.0f) * 0.8f && b == -2.0f * 0.6f + 1.5f * 0.8f, "rope_pair is the rotate-half formula");
}

void test_exp() {
  float worst = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.001173f) {
    const float got = exp_f32(x), want = static_cast<float>(std::exp(static_cast<double>(x)));
    const float ulp = std::nextafter(want, INFINITY) - want;
    worst = std::fmax(worst, std::fabs(got - want) / ulp);
  }
  std::printf("exp_f32: worst %.2f ulp on [-87, 88]\n", worst);
  check(worst <= 2.0f, "exp_f32 within 2 ulp of exp", worst, 2);
  check(exp_f32(-INFINITY) == 0.0f, "exp_f32(-inf) = 0");
  check(exp_f32(0.0f) == 1.0f, "exp_f32(0) = 1");
  check(std::isnan(exp_f32(NAN)), "exp_f32(NaN) is NaN");
}

void test_softmax_merge() {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 4.f);
  double worst = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 2 + trial % 97;
    std::vector<float> s(n), v(n);
    for (int i = 0; i < n; ++i) s[i] = nd(rng), v[i] = nd(rng);
    // one pass in double: Σ softmax(s)·v
    double mx = -INFINITY, z = 0, acc = 0, mag = 0;  // mag: Σ p·|v|, the error scale
    for (float x : s) mx = std::fmax(mx, x);
    for (int i = 0; i < n; ++i) {
      const double p = std::exp(s[i] - mx);
      z += p, acc += p * v[i], mag += p * std::fabs(v[i]);
    }
    mag /= z;
    const double want = acc / z;
    // partials over random cut points, merged left to right
    const int cut = static_cast<int>(rng() % (n + 1));
    auto part = [&](int b, int e, float* accp) {
      SoftmaxPart p{-INFINITY, 0.f};
      *accp = 0;
      for (int i = b; i < e; ++i) p.m = std::fmax(p.m, s[i]);
      for (int i = b; i < e; ++i) {
        const float w = exp_f32(s[i] - p.m);
        p.l += w;
        *accp += w * v[i];
      }
      return p;
    };
    float acc_a, acc_b;
    const SoftmaxPart pa = part(0, cut, &acc_a), pb = part(cut, n, &acc_b);
    float m, wa, wb;
    softmax_merge(pa, pb, &m, &wa, &wb);
    const float l = wa * pa.l + wb * pb.l, out = (wa * acc_a + wb * acc_b) / l;
    worst = std::fmax(worst, std::fabs(out - want) / mag);
  }
  check(worst < 1e-5, "softmax_merge of two partials equals the one-pass softmax", worst, 1e-5);
  float m, wa, wb;
  softmax_merge({-INFINITY, 0.f}, {2.f, 3.f}, &m, &wa, &wb);
  check(m == 2.f && wa == 0.f && wb == 1.f, "softmax_merge gives an empty part weight 0");
  softmax_merge({-INFINITY, 0.f}, {-INFINITY, 0.f}, &m, &wa, &wb);
  check(wa == 0.f && wb == 0.f && !std::isnan(wa + wb), "softmax_merge of two empty parts has no NaN");
}

void test_attention_plan() {
  const uint32_t sms[] = {1, 58, 132};
  int bad_cover = 0, bad_empty = 0, bad_smem = 0, bad_bound = 0, configs = 0;
  for (uint32_t sm : sms)
    for (uint32_t n : {1u, 2u, 7u, 64u, 300u})
      for (uint32_t group : {1u, 4u, 8u})
        for (uint32_t kvh : {1u, 2u, 8u})
          for (uint32_t ctx_extra : {0u, 1u, 31u, 32u, 33u, 1000u, 8191u, 70000u})
            for (uint32_t fixed : {0u, 3u, 64u, 100u}) {
              const uint32_t ctx = n + ctx_extra;
              const AttnPlan p = plan_attention(n, group, kvh, 128, ctx, sm, fixed);
              ++configs;
              // rows covered by the row blocks
              if (p.row_blocks * p.rows_per_warp * kAttnWarps < p.rows || p.row_blocks == 0) ++bad_cover;
              // splits tile [0, ctx) in order without overlap
              uint32_t next = 0;
              for (uint32_t s = 0; s < p.splits; ++s) {
                uint32_t b, e;
                attn_split_range(ctx, p.splits, s, &b, &e);
                if (b != next || e < b || (b % kAttnKeyTile != 0 && b != ctx)) ++bad_cover;
                if (fixed == 0 && e == b) ++bad_empty;
                next = e;
              }
              if (next != ctx) ++bad_cover;
              if (p.splits < 1 || p.splits > kAttnMaxSplits) ++bad_cover;
              if (p.smem_bytes > 227u * 1024u) ++bad_smem;
              if (fixed == 0 && p.partial_floats > attn_partial_bound(sm, 128)) ++bad_bound;
              if (p.splits > 1 && p.partial_floats != static_cast<size_t>(p.splits) * p.rows * kvh * 130) ++bad_cover;
            }
  check(bad_cover == 0, "attention plan: row blocks cover every row; splits tile [0, ctx) in order", bad_cover, configs);
  check(bad_empty == 0, "attention plan: no empty split unless the split count is fixed", bad_empty, configs);
  check(bad_smem == 0, "attention plan: shared memory within the 227 KiB opt-in limit", bad_smem, configs);
  check(bad_bound == 0, "attention plan: partial workspace within attn_partial_bound", bad_bound, configs);
  check(attn_smem_bytes(256, 4) <= 227u * 1024u, "attention smem for head_dim 256 fits");
  const AttnPlan big = plan_attention(2048, 4, 8, 128, 2048, 132, 0);
  check(big.splits == 1 && big.rows_per_warp == 4, "attention plan: a long prefill needs no split");
  const AttnPlan dec = plan_attention(1, 4, 8, 128, 8192, 132, 0);
  check(dec.splits > 1 && dec.rows_per_warp == 1, "attention plan: decode at 8k context splits the keys", dec.splits, 1);
}

void test_gemv_gemm_plan() {
  int bad = 0;
  for (uint32_t n : {1u, 15u, 16u, 17u, 4096u, 151936u})
    for (uint32_t k : {8u, 12u, 4096u, 14336u}) {
      const GemvPlan g = plan_gemv(n, k, 2);
      if (static_cast<uint64_t>(g.blocks) * kGemvWarps * kGemvRowsPerWarp < n) ++bad;
      if (g.vector != (k % 8 == 0)) ++bad;
      const GemvPlan g4 = plan_gemv(n, k, 4);
      if (g4.vector != (k % 4 == 0)) ++bad;
      const GemmPlan m = plan_gemm(n, k, n);
      if (m.grid_m * kGemmBM < n || m.grid_n * kGemmBN < k || m.k_steps * kGemmBK < n) ++bad;
    }
  check(bad == 0, "gemv/gemm plans cover every output row and k", bad, 0);
}

void test_split_bf16() {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.f, 10.f);
  double worst = 0;
  for (int i = 0; i < 100000; ++i) {
    const float x = nd(rng);
    uint16_t hi, lo;
    split_bf16(x, &hi, &lo);
    const double sum = static_cast<double>(bf16_to_f32(hi)) + bf16_to_f32(lo);
    worst = std::fmax(worst, std::fabs(sum - x) / std::fabs(x));
  }
  check(worst <= std::ldexp(1.0, -16), "split_bf16: hi + lo within 2^-16 relative of x", worst, std::ldexp(1.0, -16));
}

}  // namespace

int main() {
  test_bf16();
  test_f16();
  test_rope();
  test_exp();
  test_softmax_merge();
  test_attention_plan();
  test_gemv_gemm_plan();
  test_split_bf16();
  std::printf("device_math: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
