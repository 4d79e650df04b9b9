// Sampling math (see sampling.h): a line-by-line port of tests/reference/sampler.ts and prng.ts. Kept
// literal on purpose — the candidate widening, the summation orders and the draw — so that the
// TypeScript sampler stays the oracle and the tokens agree exactly (sampler_test.ts, native).
#include "host/sampling.h"

#include "host/cpu_features.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <quadmath.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace kvr {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Ids sort by logit descending, ties by lower id (sampler.ts: logits[b] - logits[a] || a - b).
struct ByLogit {
  const float* l;
  bool operator()(int32_t a, int32_t b) const {
    return sm::before(l[a], a, l[b], b);  // float order = the double order of sampler.ts
  }
};

// ByLogit's order as an unsigned key: ascending keys = logits descending, -0 keyed as +0 (they
// tie in float order). For finite and +-inf logits (NaN is never a candidate).
inline uint32_t descending_key(float v) {
  const float c = v + 0.0f;  // -0 + 0 = +0 (round to nearest; no -ffast-math here)
  uint32_t u;
  std::memcpy(&u, &c, sizeof u);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending in v
  return ~u;
}

// Sorts `ids`, ascending on entry, into ByLogit order: a stable LSD radix sort on descending_key
// (equal keys keep their ascending ids: ties by lower id), skipping the bytes every key shares.
// The same sequence a comparison sort gives, for a fraction of its cost: taking the candidates
// off a heap (each comparison an unpredictable branch on an indirect load) made a top_p 0.95
// draw of a tiny-powerful row ~75 µs where this one takes ~28 µs (plain softmax draw: ~18 µs).
void sort_by_logit(const float* l, std::vector<int32_t>& ids, SamplingScratch& sc) {
  const size_t n = ids.size();
  if (n < 2) return;
  sc.keys.resize(n);
  sc.keys_tmp.resize(n);
  sc.ids_tmp.resize(n);
  uint32_t count[4][256] = {};
  for (size_t i = 0; i < n; ++i) {
    const uint32_t k = descending_key(l[ids[i]]);
    sc.keys[i] = k;
    for (int b = 0; b < 4; ++b) ++count[b][(k >> (8 * b)) & 0xff];
  }
  uint32_t* keys = sc.keys.data();
  uint32_t* keys_to = sc.keys_tmp.data();
  int32_t* from = ids.data();
  int32_t* to = sc.ids_tmp.data();
  for (int b = 0; b < 4; ++b) {
    const int shift = 8 * b;
    if (count[b][(keys[0] >> shift) & 0xff] == n) continue;  // one value: the order stands
    uint32_t at[256];
    uint32_t sum = 0;
    for (int v = 0; v < 256; ++v) {
      at[v] = sum;
      sum += count[b][v];
    }
    for (size_t i = 0; i < n; ++i) {
      const uint32_t d = at[(keys[i] >> shift) & 0xff]++;
      keys_to[d] = keys[i];
      to[d] = from[i];
    }
    std::swap(keys, keys_to);
    std::swap(from, to);
  }
  if (from != ids.data()) std::copy(from, from + n, ids.data());
}

}  // namespace

namespace {

// Error-free transformations (double-double arithmetic).
inline void two_sum(double a, double b, double* s, double* e) {
  *s = a + b;
  const double bb = *s - a;
  *e = (a - (*s - bb)) + (b - bb);
}
inline void fast_two_sum(double a, double b, double* s, double* e) {  // |a| >= |b|
  *s = a + b;
  *e = b - (*s - a);
}
inline void two_prod(double a, double b, double* p, double* e) {
  *p = a * b;
  *e = std::fma(a, b, -*p);
}

constexpr int kTableBits = 8;
constexpr int kTable = 1 << kTableBits;  // 2^(j/256), j = 0..255

// 2^(j/256) as double-double (hi + lo, |lo| <= ulp(hi)/2), computed once in quad precision.
struct Exp2Table {
  double hi[kTable], lo[kTable];
  Exp2Table() {
    for (int j = 0; j < kTable; ++j) {
      const __float128 v = exp2q(static_cast<__float128>(j) / kTable);
      hi[j] = static_cast<double>(v);
      lo[j] = static_cast<double>(v - static_cast<__float128>(hi[j]));
    }
  }
};

const Exp2Table& exp2_table() {
  static const Exp2Table t;
  return t;
}

// ln2/256 in three parts: C1 has 32 significant bits (k·C1 exact for |k| < 2^21), C2 and C3 the
// rest; together they carry ~ 2^-120 relative precision.
const double kInvLn2N = 369.3299304675746;  // 256/ln2
const double kC1 = 0x1.62e42fefp-9;
const double kC2 = static_cast<double>(
    logq(static_cast<__float128>(2)) / 256 - static_cast<__float128>(0x1.62e42fefp-9));
const double kC3 = static_cast<double>(logq(static_cast<__float128>(2)) / 256 -
                                       static_cast<__float128>(0x1.62e42fefp-9) -
                                       static_cast<__float128>(kC2));

}  // namespace

// exp(x) rounded correctly to nearest: a double-double evaluation (table of 2^(j/256), degree-6
// polynomial; ~2^-90 relative error) rounded once, with the quad-precision libquadmath exp for
// results too close to a rounding midpoint to decide and for the overflow/subnormal ranges.
// V8's Math.exp is correctly rounded (0 differences in 200k random arguments), so this matches it
// bit for bit; glibc's exp differs in ~0.1% of arguments and is not used.
// log(x) rounded correctly to nearest: the quad-precision libquadmath log rounded once (wrong only
// within ~2^-110 of a rounding midpoint). V8's Math.log is correctly rounded (0 differences from
// this in 1M random arguments over [1e-300, 1e300]; glibc's log differs in ~0.01%). Called once
// per row, so its ~1 µs does not matter.
double js_log(double x) { return static_cast<double>(logq(static_cast<__float128>(x))); }

double js_exp(double x) {
  if (std::isnan(x)) return x;
  if (x > 709.0 || x < -708.0) {
    if (x == kInf) return kInf;
    if (x == -kInf) return 0.0;
    return static_cast<double>(expq(static_cast<__float128>(x)));
  }
  if (std::fabs(x) < 0x1p-60) return 1.0 + x;
  const Exp2Table& tb = exp2_table();
  const double kd = std::nearbyint(x * kInvLn2N);
  const long k = static_cast<long>(kd);
  // r = x - k·ln2/256 as rh + rl.
  const double t1 = x - kd * kC1;  // exact: kd·kC1 is exact and t1 is close to x (Sterbenz-like)
  double p2, e2;
  two_prod(kd, kC2, &p2, &e2);
  double rh, rl;
  two_sum(t1, -p2, &rh, &rl);
  rl -= e2 + kd * kC3;
  double r2, r2e;  // rh² exactly
  two_prod(rh, rh, &r2, &r2e);
  // exp(r) − 1 − r − r²/2 beyond the exact leading terms (|r| < 2^-9.4: next term ~2^-82).
  const double tail = rh * r2 * (1.0 / 6 + rh * (1.0 / 24 + rh * (1.0 / 120 + rh * (1.0 / 720))));
  // e = 1 + rh + r²/2 + (rl + rh·rl + r2e/2 + tail)
  double eh, el;
  fast_two_sum(1.0, rh, &eh, &el);
  double s, se;
  two_sum(eh, 0.5 * r2, &s, &se);
  el += se + (rl + rh * rl + 0.5 * r2e + tail);
  fast_two_sum(s, el, &eh, &el);
  // × 2^(j/256)
  const long j = ((k % kTable) + kTable) % kTable;
  const long m = (k - j) / kTable;
  double ph, pl;
  two_prod(tb.hi[j], eh, &ph, &pl);
  pl += tb.hi[j] * el + tb.lo[j] * eh;
  double h, l;
  fast_two_sum(ph, pl, &h, &l);
  // h = round(h + l) already; undecidable when l is within the evaluation error of ±ulp(h)/2.
  const double ulp = std::nextafter(std::fabs(h), kInf) - std::fabs(h);
  const double dist = std::fabs(std::fabs(l) - 0.5 * ulp);
  if (dist < ulp * 0x1p-20) return static_cast<double>(expq(static_cast<__float128>(x)));
  return std::ldexp(h, static_cast<int>(m));
}

#if defined(__x86_64__)
namespace {

// js_exp over 8 lanes with AVX-512F: the scalar evaluation's operations in the same order (each
// IEEE operation rounds the same in a lane as in a scalar register, fma included), so a lane's
// result has the same bits as js_exp. Lanes the fast path does not decide — NaN, the overflow and
// subnormal ranges, |x| < 2^-60, and results too close to a rounding midpoint — are flagged for
// the scalar js_exp. Returns the flagged lanes' bit mask.
__attribute__((target("avx512f"))) unsigned exp8_avx512(const double* xp, double* out) {
  // Masked forms with every lane on: the plain ones start from _mm512_undefined_pd, which GCC 12
  // reports as uninitialized.
  constexpr __mmask8 kAll = 0xFF;
  const __m512d x = _mm512_loadu_pd(xp);
  const __mmask8 ok = _mm512_cmp_pd_mask(x, _mm512_set1_pd(709.0), _CMP_LE_OQ) &
                      _mm512_cmp_pd_mask(x, _mm512_set1_pd(-708.0), _CMP_GE_OQ) &
                      _mm512_cmp_pd_mask(_mm512_abs_pd(x), _mm512_set1_pd(0x1p-60), _CMP_GE_OQ);
  const Exp2Table& tb = exp2_table();
  const __m512d kd = _mm512_maskz_roundscale_pd(kAll, _mm512_mul_pd(x, _mm512_set1_pd(kInvLn2N)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512d t1 = _mm512_sub_pd(x, _mm512_mul_pd(kd, _mm512_set1_pd(kC1)));
  const __m512d c2 = _mm512_set1_pd(kC2);
  const __m512d p2 = _mm512_mul_pd(kd, c2);
  const __m512d e2 = _mm512_fmsub_pd(kd, c2, p2);
  // two_sum(t1, -p2)
  const __m512d np2 = _mm512_sub_pd(_mm512_setzero_pd(), p2);
  const __m512d rh = _mm512_add_pd(t1, np2);
  const __m512d bb = _mm512_sub_pd(rh, t1);
  __m512d rl = _mm512_add_pd(_mm512_sub_pd(t1, _mm512_sub_pd(rh, bb)), _mm512_sub_pd(np2, bb));
  rl = _mm512_sub_pd(rl, _mm512_add_pd(e2, _mm512_mul_pd(kd, _mm512_set1_pd(kC3))));
  const __m512d r2 = _mm512_mul_pd(rh, rh);
  const __m512d r2e = _mm512_fmsub_pd(rh, rh, r2);
  __m512d poly = _mm512_add_pd(_mm512_set1_pd(1.0 / 120), _mm512_mul_pd(rh, _mm512_set1_pd(1.0 / 720)));
  poly = _mm512_add_pd(_mm512_set1_pd(1.0 / 24), _mm512_mul_pd(rh, poly));
  poly = _mm512_add_pd(_mm512_set1_pd(1.0 / 6), _mm512_mul_pd(rh, poly));
  const __m512d tail = _mm512_mul_pd(_mm512_mul_pd(rh, r2), poly);
  const __m512d one = _mm512_set1_pd(1.0), half = _mm512_set1_pd(0.5);
  // fast_two_sum(1, rh)
  __m512d eh = _mm512_add_pd(one, rh);
  __m512d el = _mm512_sub_pd(rh, _mm512_sub_pd(eh, one));
  // two_sum(eh, 0.5 r2)
  const __m512d hr2 = _mm512_mul_pd(half, r2);
  const __m512d s = _mm512_add_pd(eh, hr2);
  const __m512d sbb = _mm512_sub_pd(s, eh);
  const __m512d se = _mm512_add_pd(_mm512_sub_pd(eh, _mm512_sub_pd(s, sbb)), _mm512_sub_pd(hr2, sbb));
  __m512d inner = _mm512_add_pd(rl, _mm512_mul_pd(rh, rl));
  inner = _mm512_add_pd(inner, _mm512_mul_pd(half, r2e));
  inner = _mm512_add_pd(inner, tail);
  el = _mm512_add_pd(el, _mm512_add_pd(se, inner));
  // fast_two_sum(s, el)
  eh = _mm512_add_pd(s, el);
  el = _mm512_sub_pd(el, _mm512_sub_pd(eh, s));
  // k = 256 m + j, 0 <= j < 256 (kd is an integer well inside the exact range)
  const __m512d m = _mm512_maskz_roundscale_pd(kAll, _mm512_mul_pd(kd, _mm512_set1_pd(1.0 / kTable)),
                                         _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512d jd = _mm512_sub_pd(kd, _mm512_mul_pd(m, _mm512_set1_pd(kTable)));
  const __m256i j = _mm512_mask_cvtpd_epi32(_mm256_setzero_si256(), ok, jd);
  const __m512d thi = _mm512_mask_i32gather_pd(_mm512_setzero_pd(), kAll, j, tb.hi, 8);
  const __m512d tlo = _mm512_mask_i32gather_pd(_mm512_setzero_pd(), kAll, j, tb.lo, 8);
  // two_prod(hi, eh)
  const __m512d ph = _mm512_mul_pd(thi, eh);
  __m512d pl = _mm512_fmsub_pd(thi, eh, ph);
  pl = _mm512_add_pd(pl, _mm512_add_pd(_mm512_mul_pd(thi, el), _mm512_mul_pd(tlo, eh)));
  // fast_two_sum(ph, pl)
  const __m512d h = _mm512_add_pd(ph, pl);
  const __m512d l = _mm512_sub_pd(pl, _mm512_sub_pd(h, ph));
  // ulp(|h|) = 2^(exponent - 52) for a normal h; undecided when |l| is within 2^-20 ulp of ulp/2
  const __m512d ah = _mm512_abs_pd(h);
  const __m512d ulp = _mm512_maskz_scalef_pd(kAll, one, _mm512_sub_pd(_mm512_maskz_getexp_pd(kAll, ah), _mm512_set1_pd(52.0)));
  const __m512d dist = _mm512_abs_pd(_mm512_sub_pd(_mm512_abs_pd(l), _mm512_mul_pd(half, ulp)));
  const __mmask8 near = _mm512_cmp_pd_mask(dist, _mm512_mul_pd(ulp, _mm512_set1_pd(0x1p-20)), _CMP_LT_OQ);
  const __mmask8 good = ok & static_cast<__mmask8>(~near);
  // ldexp(h, m): exact, the result is normal in this range
  _mm512_storeu_pd(out, _mm512_maskz_scalef_pd(kAll, h, m));
  return static_cast<unsigned>(static_cast<uint8_t>(~good));
}

// The same over 4 lanes with AVX2 + FMA: rounding by _mm256_round_pd, the table index converted
// to int32, and the powers of two built from their exponent bits (every value here is normal).
// Written out apart from exp8_avx512: a template shared by both would need a target attribute
// per instantiation, which GCC does not give; sample_math_test checks each against js_exp.
__attribute__((target("avx2,fma"))) unsigned exp4_avx2(const double* xp, double* out) {
  const __m256d x = _mm256_loadu_pd(xp);
  const __m256d ok = _mm256_and_pd(
      _mm256_and_pd(_mm256_cmp_pd(x, _mm256_set1_pd(709.0), _CMP_LE_OQ),
                    _mm256_cmp_pd(x, _mm256_set1_pd(-708.0), _CMP_GE_OQ)),
      _mm256_cmp_pd(_mm256_andnot_pd(_mm256_set1_pd(-0.0), x), _mm256_set1_pd(0x1p-60), _CMP_GE_OQ));
  const Exp2Table& tb = exp2_table();
  const __m256d kd = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(kInvLn2N)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256d t1 = _mm256_sub_pd(x, _mm256_mul_pd(kd, _mm256_set1_pd(kC1)));
  const __m256d c2 = _mm256_set1_pd(kC2);
  const __m256d p2 = _mm256_mul_pd(kd, c2);
  const __m256d e2 = _mm256_fmsub_pd(kd, c2, p2);
  const __m256d np2 = _mm256_sub_pd(_mm256_setzero_pd(), p2);
  const __m256d rh = _mm256_add_pd(t1, np2);
  const __m256d bb = _mm256_sub_pd(rh, t1);
  __m256d rl = _mm256_add_pd(_mm256_sub_pd(t1, _mm256_sub_pd(rh, bb)), _mm256_sub_pd(np2, bb));
  rl = _mm256_sub_pd(rl, _mm256_add_pd(e2, _mm256_mul_pd(kd, _mm256_set1_pd(kC3))));
  const __m256d r2 = _mm256_mul_pd(rh, rh);
  const __m256d r2e = _mm256_fmsub_pd(rh, rh, r2);
  __m256d poly = _mm256_add_pd(_mm256_set1_pd(1.0 / 120), _mm256_mul_pd(rh, _mm256_set1_pd(1.0 / 720)));
  poly = _mm256_add_pd(_mm256_set1_pd(1.0 / 24), _mm256_mul_pd(rh, poly));
  poly = _mm256_add_pd(_mm256_set1_pd(1.0 / 6), _mm256_mul_pd(rh, poly));
  const __m256d tail = _mm256_mul_pd(_mm256_mul_pd(rh, r2), poly);
  const __m256d one = _mm256_set1_pd(1.0), half = _mm256_set1_pd(0.5);
  __m256d eh = _mm256_add_pd(one, rh);
  __m256d el = _mm256_sub_pd(rh, _mm256_sub_pd(eh, one));
  const __m256d hr2 = _mm256_mul_pd(half, r2);
  const __m256d s = _mm256_add_pd(eh, hr2);
  const __m256d sbb = _mm256_sub_pd(s, eh);
  const __m256d se = _mm256_add_pd(_mm256_sub_pd(eh, _mm256_sub_pd(s, sbb)), _mm256_sub_pd(hr2, sbb));
  __m256d inner = _mm256_add_pd(rl, _mm256_mul_pd(rh, rl));
  inner = _mm256_add_pd(inner, _mm256_mul_pd(half, r2e));
  inner = _mm256_add_pd(inner, tail);
  el = _mm256_add_pd(el, _mm256_add_pd(se, inner));
  eh = _mm256_add_pd(s, el);
  el = _mm256_sub_pd(el, _mm256_sub_pd(eh, s));
  const __m256d m = _mm256_round_pd(_mm256_mul_pd(kd, _mm256_set1_pd(1.0 / kTable)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  // lanes not ok may hold anything: their index is forced to 0 (the result is discarded)
  const __m256d jd = _mm256_and_pd(ok, _mm256_sub_pd(kd, _mm256_mul_pd(m, _mm256_set1_pd(kTable))));
  const __m128i j = _mm256_cvtpd_epi32(jd);
  // the masked gather with every lane on: the plain one starts from an undefined register (GCC 12)
  const __m256d all = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
  const __m256d thi = _mm256_mask_i32gather_pd(_mm256_setzero_pd(), tb.hi, j, all, 8);
  const __m256d tlo = _mm256_mask_i32gather_pd(_mm256_setzero_pd(), tb.lo, j, all, 8);
  const __m256d ph = _mm256_mul_pd(thi, eh);
  __m256d pl = _mm256_fmsub_pd(thi, eh, ph);
  pl = _mm256_add_pd(pl, _mm256_add_pd(_mm256_mul_pd(thi, el), _mm256_mul_pd(tlo, eh)));
  const __m256d h = _mm256_add_pd(ph, pl);
  const __m256d l = _mm256_sub_pd(pl, _mm256_sub_pd(h, ph));
  const __m256d sign = _mm256_set1_pd(-0.0);
  const __m256d ah = _mm256_andnot_pd(sign, h);
  // ulp(|h|) = 2^(exponent - 52): the exponent bits of |h| less 52
  const __m256i exp_bits = _mm256_and_si256(_mm256_castpd_si256(ah), _mm256_set1_epi64x(0x7FF0000000000000LL));
  const __m256d ulp = _mm256_castsi256_pd(_mm256_sub_epi64(exp_bits, _mm256_set1_epi64x(52LL << 52)));
  const __m256d dist = _mm256_andnot_pd(sign, _mm256_sub_pd(_mm256_andnot_pd(sign, l), _mm256_mul_pd(half, ulp)));
  const __m256d near = _mm256_cmp_pd(dist, _mm256_mul_pd(ulp, _mm256_set1_pd(0x1p-20)), _CMP_LT_OQ);
  // ldexp(h, m) = h * 2^m, 2^m from its exponent bits (m in [-1022, 1022] for ok lanes)
  const __m256d mm = _mm256_and_pd(ok, m);
  const __m128i mi = _mm256_cvtpd_epi32(mm);
  const __m256i pow2 = _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(mi), _mm256_set1_epi64x(1023)), 52);
  _mm256_storeu_pd(out, _mm256_mul_pd(h, _mm256_castsi256_pd(pow2)));
  const int good = _mm256_movemask_pd(_mm256_andnot_pd(near, ok));
  return static_cast<unsigned>(~good) & 0xFu;
}

// A kernel of W lanes over the whole groups of x[0..n), then the scalar js_exp for the lanes it
// flagged as undecided. Returns where the groups end.
template <size_t W, unsigned (*Kernel)(const double*, double*)>
size_t exp_lanes(const double* x, double* out, size_t n) {
  size_t i = 0;
  for (; i + W <= n; i += W)
    for (unsigned slow = Kernel(x + i, out + i); slow != 0; slow &= slow - 1) {
      const size_t b = static_cast<size_t>(__builtin_ctz(slow));
      out[i + b] = js_exp(x[i + b]);
    }
  return i;
}

}  // namespace
#endif

const char* js_exp_many_path() {
#if defined(__x86_64__)
  if (cpu::use_avx512_exp()) return "avx512";
  if (cpu::use_avx2_exp()) return "avx2";
#endif
  return "scalar";
}

void js_exp_many(const double* x, double* out, size_t n) {
  size_t i = 0;
#if defined(__x86_64__)
  if (cpu::use_avx512_exp()) i = exp_lanes<8, exp8_avx512>(x, out, n);
  else if (cpu::use_avx2_exp()) i = exp_lanes<4, exp4_avx2>(x, out, n);
#endif
  for (; i < n; ++i) out[i] = js_exp(x[i]);
}

bool RepetitionPenalty::add(int32_t id) {
  if (id < 0) return false;
  const size_t i = static_cast<size_t>(id);
  if (i >= seen.size()) seen.resize(i + 1, 0);
  if (seen[i] != 0) return false;
  seen[i] = 1;
  ids.push_back(id);
  return true;
}

void RepetitionPenalty::forget_last(int32_t id) {
  seen[static_cast<size_t>(id)] = 0;
  ids.pop_back();
}

void RepetitionPenalty::apply(float* row, size_t n) const {
  for (const int32_t id : ids) {
    const size_t i = static_cast<size_t>(id);
    if (i >= n) continue;
    const double v = row[i];
    // vLLM: where(logit > 0, logit / p, logit * p); NaN stays NaN, -inf stays -inf for p > 0.
    row[i] = static_cast<float>(v > 0 ? v / penalty : v * penalty);
  }
}

void LogitAdjust::add(int32_t id) {
  ++drawn;
  if (id < 0 || !penalising()) return;
  const size_t i = static_cast<size_t>(id);
  if (i >= counts.size()) counts.resize(i + 1, 0);
  if (counts[i]++ == 0) drawn_ids.push_back(id);
}

void LogitAdjust::undo_add(int32_t id) {
  --drawn;
  if (id < 0 || !penalising()) return;
  if (--counts[static_cast<size_t>(id)] == 0) drawn_ids.pop_back();
}

void LogitAdjust::apply_before(float* row, size_t n) const {
  if (banning())
    for (const int32_t id : ban_ids)
      if (static_cast<size_t>(id) < n) row[id] = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < bias_ids.size(); ++j) {
    const size_t i = static_cast<size_t>(bias_ids[j]);
    if (i < n) row[i] = static_cast<float>(static_cast<double>(row[i]) + bias[j]);
  }
}

void LogitAdjust::apply_after(float* row, size_t n) const {
  if (!penalising()) return;
  for (const int32_t id : drawn_ids) {
    const size_t i = static_cast<size_t>(id);
    if (i >= n) continue;
    const double by = static_cast<double>(counts[i]) * frequency + presence;
    row[i] = static_cast<float>(static_cast<double>(row[i]) - by);
  }
}

int64_t argmax_row(const float* logits, size_t n) {
  // Two passes over 16-wide blocks instead of one scalar pass with a compare-and-branch per
  // logit (~5 µs per 4096-logit row, 0.15 ms of a 32-row batched step): the largest value (NaN
  // never compares greater, so NaN and -inf are never chosen, as before; SSE max keeps its
  // second operand for NaN and for ties, the same as `x > m ? x : m`), then the first index
  // holding it — the id of the single pass (lowest id on ties; -0 and +0 tie).
  const float neg_inf = -std::numeric_limits<float>::infinity();
  size_t i = 0;
  float mx = neg_inf;
#if defined(__SSE2__)
  __m128 acc[4];
  for (__m128& a : acc) a = _mm_set1_ps(neg_inf);
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 4; ++j) acc[j] = _mm_max_ps(_mm_loadu_ps(logits + i + 4 * j), acc[j]);
  alignas(16) float lane[16];
  for (int j = 0; j < 4; ++j) _mm_store_ps(lane + 4 * j, acc[j]);
  for (float v : lane) mx = v > mx ? v : mx;
#endif
  for (; i < n; ++i) mx = logits[i] > mx ? logits[i] : mx;
  if (!(mx > neg_inf)) return -1;
  size_t b = 0;
#if defined(__SSE2__)
  const __m128 m4 = _mm_set1_ps(mx);
  for (; b + 16 <= n; b += 16) {
    int hit = 0;
    for (int j = 0; j < 4; ++j) hit |= _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(logits + b + 4 * j), m4)) << (4 * j);
    if (hit != 0) return static_cast<int64_t>(b) + __builtin_ctz(static_cast<unsigned>(hit));
  }
#endif
  for (; b < n; ++b)
    if (logits[b] == mx) return static_cast<int64_t>(b);
  return -1;  // not reached: mx is one of the logits
}

namespace {

// limitRow of sampler.ts: the row sampling runs on when l holds +inf (such tokens outweigh every
// finite one, so in the limit they share all the probability equally): 0 where l is +inf, -inf
// elsewhere. Keeps inf − inf (NaN) out of the sums and the candidate widening, which a NaN floor
// made spin forever.
const float* limit_row(const float* l, size_t n, std::vector<float>& out) {
  out.assign(n, -std::numeric_limits<float>::infinity());
  for (size_t i = 0; i < n; ++i)
    if (static_cast<double>(l[i]) == kInf) out[i] = 0.0f;
  return out.data();
}

#if defined(__x86_64__)
// How many of l[0..n) are >= floor, and the sum of their terms over 8 lanes (not in id order:
// within (count + 3)·2^-53 of it, relatively, as both sum positive terms).
__attribute__((target("avx512f"))) size_t mass_above_avx512(const float* l, const double* terms, size_t n,
                                                            double floor, double* approx) {
  __m512d acc = _mm512_setzero_pd();
  const __m512d fl = _mm512_set1_pd(floor);
  size_t count = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d v = _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(l + i));  // maskz: see exp8_avx512
    const __mmask8 k = _mm512_cmp_pd_mask(v, fl, _CMP_GE_OQ);
    count += static_cast<size_t>(__builtin_popcount(k));
    acc = _mm512_add_pd(acc, _mm512_maskz_loadu_pd(k, terms + i));
  }
  alignas(64) double lane[8];
  _mm512_store_pd(lane, acc);
  double a = 0;
  for (const double x : lane) a += x;
  for (; i < n; ++i)
    if (static_cast<double>(l[i]) >= floor) {
      ++count;
      a += terms[i];
    }
  *approx = a;
  return count;
}
#endif

// Σ exp((l[i] − max)/temperature) over the finite logits, in id order (terms[i] = each term when
// terms is given). Each block's finite logits are packed first, their terms come from
// js_exp_many (vectorised where the CPU allows), then are added in id order: the same terms and
// the same sum as one exp and one add per finite logit, and no exp for the others (a row under a
// grammar's mask may hold a handful of finite logits among the vocabulary).
void exp_sum(const float* l, size_t n, double max, double temperature, double* terms, double* total) {
  constexpr size_t kBlock = 256;
  double xs[kBlock], es[kBlock];
  uint32_t at[kBlock];
  double tot = 0;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    size_t m = 0;
    for (size_t i = b; i < e; ++i) {  // branch-free packing: dense rows pay no mispredictions
      const double v = l[i];
      xs[m] = (v - max) / temperature;
      at[m] = static_cast<uint32_t>(i);
      m += v > -kInf ? 1 : 0;
    }
    js_exp_many(xs, es, m);
    for (size_t j = 0; j < m; ++j) {
      if (terms) terms[at[j]] = es[j];
      tot += es[j];
    }
  }
  *total = tot;
}

// softmaxMass of sampler.ts: max finite logit, Σ exp((l − max)/T) over finite logits in id order
// (skipped when want_total is false: the caller does not read it), and how many are finite.
// When terms is given, terms[i] = exp((l[i] − max)/T) for finite logits (for the caller to reuse).
void softmax_mass(const float* l, size_t n, double temperature, bool want_total, double* max,
                  double* total, size_t* finite, double* terms = nullptr) {
  double mx = -kInf;
  size_t f = 0;
  for (size_t i = 0; i < n; ++i) {
    const double v = l[i];
    if (v > -kInf) {
      ++f;
      if (v > mx) mx = v;
    }
  }
  double tot = 0;
  if (f > 0 && want_total) exp_sum(l, n, mx, temperature, terms, &tot);
  *max = mx;
  *total = tot;
  *finite = f;
}

// samplingDistribution of sampler.ts: fills scratch.ids / scratch.probs (first `*kept` entries)
// with the kept ids, most likely first, and their renormalised probabilities; *kept 0 when no
// logit is finite.
void sampling_distribution(const float* l, size_t n, const SamplingConfig& cfg,
                           SamplingScratch& sc, size_t* kept) {
  const double temperature = cfg.temperature, top_p = cfg.top_p, min_p = cfg.min_p;
  const size_t top_k = cfg.top_k;
  double max, total;
  size_t finite;
  // total and the candidates' mass matter only without top_k (sampler.ts reads them there only).
  // Then each finite logit's exp term is kept: the candidates' mass at every widening and their
  // probabilities reuse it (the same js_exp of the same argument: the same bits, computed once).
  const bool need_mass = top_k == 0;
  double* terms = nullptr;
  if (need_mass) {
    sc.terms.resize(n);
    terms = sc.terms.data();
  }
  softmax_mass(l, n, temperature, need_mass, &max, &total, &finite, terms);
  if (finite == 0) {
    *kept = 0;
    return;
  }
  if (max == kInf) {
    l = limit_row(l, n, sc.limit);
    softmax_mass(l, n, temperature, need_mass, &max, &total, &finite, terms);
  }
  const auto term = [&](size_t i) {
    return terms ? terms[i] : js_exp((static_cast<double>(l[i]) - max) / temperature);
  };
  const bool no_filter = top_k == 0 && top_p >= 1 && min_p == 0;
  double delta = no_filter ? kInf : 1;
  auto widen = [&] { delta = delta > 1e4 ? kInf : delta * 2; };
  while (true) {
    const double floor = max - delta * temperature;
    if (delta != kInf) {
      size_t count = 0;
      double mass = 0;
      // top_p's test needs only whether the candidates' mass reaches top_p·total: a lane-wise sum
      // (another order) decides it unless it lies within its rounding bound of the threshold;
      // only then is the exact id-order sum taken.
      bool decided = false, reached = false;
#if defined(__x86_64__)
      if (need_mass && top_p < 1 && cpu::use_avx512_exp()) {
        double approx;
        count = mass_above_avx512(l, terms, n, floor, &approx);
        const double threshold = top_p * total;
        const double margin = approx * (2.0 * static_cast<double>(count) + 16) * 0x1p-52;
        if (approx - margin > threshold || approx + margin < threshold) {
          decided = true;
          reached = approx > threshold;
        }
      }
#endif
      if (!decided) {
        count = 0;
        for (size_t i = 0; i < n; ++i) {
          const double v = l[i];
          if (v >= floor) {
            ++count;
            if (need_mass && top_p < 1) mass += terms[i];
          }
        }
        reached = mass >= top_p * total;
      }
      const bool enough =
          count == finite || (top_k > 0    ? count >= top_k
                              : top_p < 1 ? reached
                                          : min_p >= js_exp(-delta));
      if (!enough) {
        widen();
        continue;
      }
    }
    sc.ids.clear();
    for (size_t i = 0; i < n; ++i) {
      const double v = l[i];
      if (v > -kInf && v >= floor) sc.ids.push_back(static_cast<int32_t>(i));
    }
    const bool all = sc.ids.size() == finite;
    if (top_k > 0 && sc.ids.size() < top_k && !all) {
      widen();
      continue;
    }
    size_t m = top_k > 0 ? std::min(top_k, sc.ids.size()) : sc.ids.size();
    if (top_k == 0 && top_p < 1 && min_p == 0) {
      // top_p alone reads the sorted ids only until their probabilities reach top_p: sort the
      // candidates by key (ties by id: a total order, the same sequence as ByLogit's sort) and
      // take them in order until there.
      sort_by_logit(l, sc.ids, sc);
      sc.probs.clear();
      double cumulative = 0;
      bool reached = false;
      for (size_t j = 0; j < sc.ids.size() && !reached; ++j) {
        const double p = term(static_cast<size_t>(sc.ids[j])) / total;
        sc.probs.push_back(p);
        cumulative += p;
        reached = cumulative >= top_p;
      }
      if (!reached && !all) {
        widen();
        continue;
      }
      m = sc.probs.size();
      double sum = 0;
      for (size_t j = 0; j < m; ++j) sum += sc.probs[j];
      for (size_t j = 0; j < m; ++j) sc.probs[j] /= sum;
      *kept = m;
      return;
    }
    // Only the first m ids in sorted order are ever read: a partial sort gives the same prefix.
    if (m < sc.ids.size()) {
      std::partial_sort(sc.ids.begin(), sc.ids.begin() + static_cast<long>(m), sc.ids.end(),
                        ByLogit{l});
    } else {
      std::sort(sc.ids.begin(), sc.ids.end(), ByLogit{l});
    }
    sc.probs.resize(m);
    double sum_kept = 0;
    for (size_t j = 0; j < m; ++j) {
      sc.probs[j] = term(static_cast<size_t>(sc.ids[j]));
      sum_kept += sc.probs[j];
    }
    const double norm = top_k > 0 ? sum_kept : total;
    for (size_t j = 0; j < m; ++j) sc.probs[j] /= norm;
    bool cut_inside = top_k > 0 || all;
    if (top_p < 1) {
      double cumulative = 0;
      long keep = -1;
      for (size_t j = 0; j < m; ++j) {
        cumulative += sc.probs[j];
        if (cumulative >= top_p) {
          keep = static_cast<long>(j) + 1;
          break;
        }
      }
      if (keep < 0 && !cut_inside) {
        widen();
        continue;
      }
      if (keep > 0) {
        m = static_cast<size_t>(keep);
        cut_inside = true;
      }
    }
    if (min_p > 0) {
      if (!cut_inside && min_p < js_exp(-delta)) {
        widen();
        continue;
      }
      const double threshold = min_p * sc.probs[0];
      size_t keep = 1;
      while (keep < m && sc.probs[keep] >= threshold) ++keep;
      m = keep;
    } else if (!cut_inside) {
      widen();
      continue;
    }
    double sum = 0;
    for (size_t j = 0; j < m; ++j) sum += sc.probs[j];
    for (size_t j = 0; j < m; ++j) sc.probs[j] /= sum;
    *kept = m;
    return;
  }
}

}  // namespace

int64_t sample_row(const float* l, size_t n, const SamplingConfig& cfg, Xoshiro128& rng,
                   SamplingScratch& sc) {
  if (cfg.top_k == 0 && cfg.top_p >= 1 && cfg.min_p == 0) {
    // Plain softmax sampling: one pass in id order, no sort.
    double max, total;
    size_t finite;
    sc.probs.resize(n);  // the exp terms, computed once and summed twice in the same order
    softmax_mass(l, n, cfg.temperature, true, &max, &total, &finite, sc.probs.data());
    if (max == kInf) {
      l = limit_row(l, n, sc.limit);
      softmax_mass(l, n, cfg.temperature, true, &max, &total, &finite, sc.probs.data());
    }
    if (finite == 0) return -1;
    const double target = rng.next_double() * total;
    double cumulative = 0;
    int64_t last = -1;
    for (size_t i = 0; i < n; ++i) {
      const double v = l[i];
      if (!(v > -kInf)) continue;
      cumulative += sc.probs[i];
      last = static_cast<int64_t>(i);
      if (target < cumulative) return last;
    }
    return last;  // target within rounding of total
  }
  size_t m = 0;
  sampling_distribution(l, n, cfg, sc, &m);
  if (m == 0) return -1;  // no finite logit
  const double u = rng.next_double();
  double cumulative = 0;
  for (size_t j = 0; j < m; ++j) {
    cumulative += sc.probs[j];
    if (u < cumulative) return sc.ids[j];
  }
  return sc.ids[m - 1];  // u within rounding of 1
}

int64_t sample_candidates(const float* vals, const int32_t* ids, size_t m, const SamplingConfig& cfg,
                          Xoshiro128& rng, SamplingScratch& sc) {
  if (m == 0) return -1;
  const int64_t j = sample_row(vals, m, cfg, rng, sc);  // compact index: ties keep the id order
  return j < 0 ? -1 : ids[j];
}

size_t select_candidates(const float* l, size_t n, size_t k, float* vals, int32_t* ids) {
  size_t count = 0;
  for (size_t i = 0; i < n && k > 0; ++i) {
    if (!sm::selectable(l[i])) continue;
    const int32_t c = static_cast<int32_t>(i);
    if (count == k && !sm::before(l[i], c, vals[k - 1], ids[k - 1])) continue;
    size_t pos = count < k ? count++ : k - 1;
    while (pos > 0 && sm::before(l[i], c, vals[pos - 1], ids[pos - 1])) {
      vals[pos] = vals[pos - 1];
      ids[pos] = ids[pos - 1];
      --pos;
    }
    vals[pos] = l[i];
    ids[pos] = c;
  }
  return count;
}

size_t logprobs_row(const float* l, size_t n, int64_t id, double* id_logprob, size_t top,
                    int32_t* top_ids, double* top_logprobs) {
  if (id_logprob == nullptr && top == 0) return 0;  // nothing asked: no exp pass
  double max = -kInf;
  for (size_t i = 0; i < n; ++i) {
    const double v = l[i];
    if (v > max) max = v;
  }
  std::vector<float> limited;  // +inf tokens share the probability: -log(count) each (logits.ts)
  if (max == kInf) {
    l = limit_row(l, n, limited);
    max = 0;
  }
  double total = 0;
  exp_sum(l, n, max, 1.0, nullptr, &total);
  // The same expression as tests/reference/logits.ts stepLogprobs (max + Math.log(sum), then
  // logit − lse), so both give the same bits: the HTTP logprobs may come from either.
  const double lse = max + js_log(total);
  auto lp = [&](int64_t i) {
    const double v = l[i];
    return v > -kInf ? v - lse : -kInf;
  };
  if (id_logprob != nullptr) *id_logprob = id >= 0 ? lp(id) : -kInf;
  if (top == 0) return 0;
  // Top `top` by a bounded insertion list: O(n · top), top is small (≤ 20 through the ABI).
  size_t count = 0;
  const ByLogit better{l};
  for (size_t i = 0; i < n; ++i) {
    const double v = l[i];
    if (!(v > -kInf)) continue;
    const int32_t c = static_cast<int32_t>(i);
    if (count == top && !better(c, top_ids[count - 1])) continue;
    size_t pos = count < top ? count++ : top - 1;
    while (pos > 0 && better(c, top_ids[pos - 1])) {
      top_ids[pos] = top_ids[pos - 1];
      --pos;
    }
    top_ids[pos] = c;
  }
  for (size_t j = 0; j < count; ++j) top_logprobs[j] = lp(top_ids[j]);
  return count;
}

}  // namespace kvr
